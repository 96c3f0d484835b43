"""The embedded default model: weights and model card trained on Shapes World (see MODEL_CARD.md)."""
