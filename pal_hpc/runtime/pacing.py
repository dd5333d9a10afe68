"""How the main loops pace themselves when a turn had nothing to do.

Its own module because the planner (pal_hpc.plan.measure) times a sleeping rank with the
same figures as the loop (pal_hpc.runtime.run) uses, and the planner sits above the
runtime: it imports from here, never from the loop.
"""

IDLE_SLEEP = 0.001          # seconds an idle rank sleeps between loop turns
REDUCING_SLEEP = 0.00002    # ... while its learner waits for an Allreduce
