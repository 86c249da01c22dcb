"""SERA workbook core library."""
__version__ = "0.1.0"
