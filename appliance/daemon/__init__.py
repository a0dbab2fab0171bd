"""The service: its lifecycle (service), the control API (api), the job supervisor, the client and the doctor."""
