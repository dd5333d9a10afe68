"""On-policy training (PAAC, PPO): one master per node drives the node's environments in
lockstep; the masters of all nodes learn together, each update step one Allreduce.

The runtime knows no algorithm: it asks the on-policy contract
(`pal_hpc.algos.onpolicy`) how many steps a round has, how to act (and which per-step
extras to keep), what every master must see of every other's round before the update
(gathered with one collective: PPO's advantages and normalization moments; PAAC's
nothing) and the update's steps (PAAC: one on the whole round; PPO: its epochs'
minibatches), each one Allreduce of [gradient | the step's sums | rank 0's votes].
What follows is PAAC's round; PPO's is in docs/ppo.md.

On each (real or virtual) node, node rank 0 is the *master*: it holds the algorithm
(on CUDA when asked and present), runs one batched forward pass per step, and after
t_max steps computes the round's gradient.  The node's other ranks are *environment
workers*: `LockstepVectorEnv.attach` turns them into servers of their share of the
node's `num_envs` environments, stepped through the node's shared window, until the
master closes the vector env.  The masters form their own communicator: each update
they sum their gradients with one Allreduce (its tail carries rank 0's stop,
checkpoint and counter-round votes, so every master stops, checkpoints and starts a
round of the job-wide counters after the same update) and take the same RMSProp step,
so their parameters stay bit-identical.

    round k:  for t < t_max: forward(s_t) -> actions -> step_async ... step_wait
              (overlap on: the update of round k-1 runs inside round k's first step;
              --async-update: round k-1's gradient runs on a thread through all of
              round k, which acts with the same parameters, and is applied at its end)
              gradient -> Allreduce over masters -> apply

The budget (--total-steps) is counted in whole rounds of every node, so every master
knows alone when the run ends; the learning rate anneals on the same count.  What the
off-policy runtime offers holds here: the progress line, the HDF5 metrics log (episode
rows from every environment's episode ends -- `actor` is the environment's global
index --, learner rows with PAAC's metrics, greedy evaluations on rank 0, system rows
from the masters), checkpoints and resume (parameters, optimizer, counters and the
masters' sampling RNGs are restored exactly; the environments start new episodes,
seeded apart from the first run's), SIGTERM/SIGUSR1, `summary.json` and
`python -m pal_hpc.analyze`.  The summary adds how the masters spent their wall
time (`master_time`): forward passes, updates, waiting for the environments, waiting
for the other masters, evaluations.

The package, one module per job (each imports only those listed before it):
- `rollout`: the round's arrays and the environments' seeds;
- `reporting`: the progress line, system rows, the metrics log, the summary's fields;
- `checkpoints`: checkpoint and resume of the masters;
- `update`: a master's update (the gathered table, the steps, the votes);
- `wind_down`: the end of the job on every rank;
- `master`: `OnPolicyRun`, the rank itself (roles, rollout loop, updates and their
  votes), built from the parts above and the off-policy side's services (Coordinator,
  Telemetry, Checkpointing, Summary); `train_on_policy`, called by runtime.entry.
"""

from pal_hpc.runtime.onpolicy.master import OnPolicyRun, train_on_policy

__all__ = ["OnPolicyRun", "train_on_policy"]
