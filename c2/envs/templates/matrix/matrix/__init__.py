"""Small dense matrices as lists of rows."""
