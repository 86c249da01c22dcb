"""SERA training: the CISPO objective, the stage schedule, the trainer."""
