"""Terminal UI for the appliance."""
