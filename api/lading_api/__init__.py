"""The HTTP intake (`lading api`): documents and batches over HTTP, through the core's one admission path."""
