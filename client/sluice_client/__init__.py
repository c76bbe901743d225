"""Client for Sluice workspace tool calls."""
