"""Small sample datasets shipped with the appliance, so the quickstart can train without the customer's data."""
