"""The cohort engine (trainer.engine: cohort): a round's clients trained as one vectorised model."""
