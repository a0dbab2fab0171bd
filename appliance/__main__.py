"""`python -m appliance` is the `appliance` command."""

from appliance import launch

launch.main()
