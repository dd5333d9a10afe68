"""How the main loops pace themselves when a turn had nothing to do.

Its own module because the planner (pal_hpc.plan.measure) times a sleeping rank with the
same figures as the loop (pal_hpc.runtime.run) uses, and the planner sits above the
runtime: it imports from here, never from the loop.
"""

IDLE_SLEEP = 0.001          # seconds an idle rank sleeps between loop turns
REDUCING_SLEEP = 0.00002    # ... while its learner waits for an Allreduce
# Linux lets a sleep overrun by the thread's timer slack, 50 us by default: a 20 us
# sleep took 75 us (median, measured here), 26 us at 1 us of slack.  Every phase's
# Allreduce wait ends in such a sleep, so the slack was a fixed latency per phase.
TIMER_SLACK_NS = 1_000
PR_SET_TIMERSLACK = 29


def tighten_timer_slack(ns: int = TIMER_SLACK_NS) -> bool:
    """Set this process's timer slack to `ns` (Linux prctl); False where unavailable.
    The rank still sleeps (it gives the core away), it just wakes when it asked to."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
