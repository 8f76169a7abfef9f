"""retr.retrieval."""
