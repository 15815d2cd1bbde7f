"""Bank accounts and interest."""
