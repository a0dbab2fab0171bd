"""The appliance: fine-tune, optimise and serve models on one server."""
