"""retr.indexes."""
