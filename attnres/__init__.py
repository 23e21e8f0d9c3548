"""attnres: AttnRes models, training, tracking and reports."""
__version__ = "0.1.0"
