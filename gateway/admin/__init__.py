"""The operator surface: the admin API, its models, and the reports."""
