"""Who may do what: users of the control API (users) and API keys of the inference server (auth)."""
