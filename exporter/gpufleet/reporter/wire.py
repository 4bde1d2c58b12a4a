"""The wire format's constants: the agent's paths and the limits of what it accepts.

One definition, shared by both ends: the client (standard library only) checks and
clamps what it sends against these, and the agent's models
(``gpufleet.agent.training_events``) validate against the same names.
"""

from __future__ import annotations

# The agent's paths (the ledger's, for attempts: the agent relays them).
STEPS_PATH = "/v1/steps"
CHECKPOINTS_PATH = "/v1/checkpoints"
FINISHED_PATH = "/v1/finished"
LAYOUT_PATH = "/v1/layout"
ATTEMPTS_PATH = "/v1/attempts"

MAX_BATCH_EVENTS = 4096  # per request; the agent's IngestLimits.max_batch_events default
MAX_ATTEMPT_EVENTS = 16  # per request to the agent: a client has at most three pending
# Longest step / checkpoint operation that is still plausible. Anything longer is
# a clock or unit mistake (milliseconds sent as seconds), not a measurement.
MAX_STEP_SECONDS = 3600.0
MAX_CHECKPOINT_SECONDS = 86400.0
MAX_TOKENS_PER_STEP = 10**9
MAX_CHECKPOINT_BYTES = 10**15  # 1 PB
MAX_STEP_NUMBER = 1 << 53
MAX_RANK = 1 << 20
MAX_STAGE = 1023
MAX_ATTEMPT = 1_000_000  # launcher restarts of one job
MAX_ID_LENGTH = 128  # a checkpoint operation's id
# A rank's parallel layout: groups per rank, and a group kind's name.
MAX_GROUPS = 8
GROUP_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,15}$"
