"""The processes that run training: actors, learners, evaluation and coordination."""
