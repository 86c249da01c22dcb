"""The paper's published numbers as data, their consistency checks, and the tables and plots built from them (SPEC 7)."""
