"""retr.eval."""
