"""Every bound a replay puts on its input, in one place: trace fields and options.

A value past a bound is refused where it enters (the trace reader, an option's
argparse type, `WorkloadRequest`), so a replay always ends, in bounded memory,
with finite numbers in every report. The bounds come from what real traces hold
and what the engine model replays in bounded time. The bundled Mooncake trace (one
hour of a chat service, 12,031 requests) has prompts of 891 to 126,195 tokens,
outputs of 1 to 2,000, timestamps up to 3,537,000 ms and hash ids up to 182,789;
a request at both length bounds replays in about a tenth of a second.
"""

from __future__ import annotations

# -- trace fields ------------------------------------------------------------------

MAX_PROMPT_TOKENS = 1 << 21
"""2,097,152 tokens: the longest context windows offered today, 16x the bundled
trace's longest prompt (4,096 hash ids of 512 tokens)."""

MAX_OUTPUT_TOKENS = 1 << 20
"""1,048,576 tokens: past any model's output limit (the bundled trace's is 2,000)."""

MAX_TIMESTAMP_MS = 10**10
"""About 116 days of arrivals, in milliseconds (the bundled trace covers one hour)."""

MAX_HASH_ID = (1 << 64) - 1
"""Hash ids are unsigned 64-bit integers (the bundled trace's are below 2^18)."""

MAX_LINE_BYTES = 1 << 20
"""One trace line; the longest prompt's 4,096 ids of 20 digits take under 100 KB."""

# -- what a workload may ask of the engine model ------------------------------------

MAX_REQUEST_TOKENS = 1 << 22
"""Prompt plus output of one request of any workload: the trace's bounds, with room
for a prompt padded to whole blocks."""

MAX_ARRIVAL_S = 1e9
"""About 32 years, after any arrival stretch: below it a float still resolves the
engine model's clock to 1e-7 s, far finer than its shortest step."""

# -- options of `kvoffload replay` --------------------------------------------------

MAX_CHUNK_TOKENS = MAX_PROMPT_TOKENS
"""A chunk longer than the longest prompt could never be stored."""

MAX_DEVICE_TOKENS = 1 << 40
MAX_CAPACITY_CHUNKS = 1 << 40
MAX_CAPACITY_TOKENS = MAX_CAPACITY_CHUNKS * MAX_CHUNK_TOKENS
MAX_CAPACITY_BYTES = 1 << 50
"""1,024 TiB of host memory: past any one host; in chunks, still bounded by
`MAX_CAPACITY_CHUNKS`."""
MAX_STORE_THRESHOLD = 1 << 20
MAX_JOBS = 1024
MAX_SEED = (1 << 64) - 1

MIN_TIME_SCALE = 1e-6
MAX_TIME_SCALE = 1e6
"""Arrival stretch factors; with `MAX_TIMESTAMP_MS` the last arrival may still pass
`MAX_ARRIVAL_S`, which the workload then refuses."""

MAX_TARGET_LOAD = 100.0
"""Of the modeled engine's prefill capacity (1.0 = saturated)."""

MAX_PREFILL_US_PER_TOKEN = 1e6
MAX_DECODE_MS = 1e6
MIN_LINK_GBPS = 1e-6
MAX_LINK_GBPS = 1e6
MAX_KV_BYTES_PER_TOKEN = 1 << 30
"""Time-model options: far past any real engine or link, yet no sum of step times
or transfer times within the other bounds overflows a float."""
# A fleet: engines replayed in one simulated clock (each holds its own tiers'
# bookkeeping, so memory grows with them), and synth-* workload sizes.
MAX_ENGINES = 4096
MAX_GENERATED_REQUESTS = 1 << 24
# The longest a request may wait for chunks in flight (the connector's max_defer_s).
MAX_DEFER_S = 3600.0
