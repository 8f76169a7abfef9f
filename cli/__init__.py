"""retr.cli."""
