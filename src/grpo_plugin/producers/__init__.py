"""Data producers on axolotl's DataProducer protocol."""
