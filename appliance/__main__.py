"""`python -m appliance` is the `appliance` command."""

from appliance.cli import main

main()
