"""Small shared helpers: seeds, JSON lines I/O."""
