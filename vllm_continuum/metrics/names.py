"""The names of the metrics continuum adds to vLLM's `/metrics`.

One place for them: collector.py exports these families and the dashboard
generator (grafana/generate.py) queries them. Prometheus adds suffixes on
the way out: a counter `NAME` is scraped as `NAME_total`, a histogram as
`NAME_bucket`, `NAME_sum` and `NAME_count`. Every family carries vLLM's
`model_name` label; the label after `#` is the family's own.
"""

# Counters
PINS = "continuum_pins"  # tool
PIN_RELEASES = "continuum_pin_releases"  # reason
RESUMES = "continuum_resumes"  # outcome: pinned, unpinned
RESUME_SOURCES = "continuum_resume_sources"  # source: pinned, gpu_cache, host_tier, recomputed
PIN_RELOAD_SAVED_SECONDS = "continuum_pin_reload_saved_seconds"
RESUME_PROMPT_TOKENS = "continuum_resume_prompt_tokens"
RESUME_CACHED_TOKENS = "continuum_resume_cached_tokens"
INVALID_HINTS = "continuum_invalid_hints"
AFFINITY_MISSES = "continuum_affinity_misses"
PINS_REFUSED = "continuum_pins_refused"
RELOADABLE_PINS = "continuum_reloadable_pins"
BLOCK_SHORTAGES = "continuum_block_shortages"
TOOL_PIN_OUTCOMES = "continuum_tool_pin_outcomes"  # tool, outcome: resumed, expired, other
EXPIRED_PIN_BLOCK_SECONDS = "continuum_expired_pin_block_seconds"  # tool
TTL_REVISITS = "continuum_ttl_revisits"  # tool, decision: held, released
SESSION_TURNS = "continuum_session_turns"  # outcome: tool_call, answer; format

# Gauges
PINNED_BLOCKS = "continuum_pinned_blocks"
PINNED_SESSIONS = "continuum_pinned_sessions"
KV_POOL_BLOCKS = "continuum_kv_pool_blocks"

# Histograms, in seconds
TTL_SECONDS = "continuum_ttl_seconds"  # tool
TOOL_DURATION_SECONDS = "continuum_tool_duration_seconds"  # tool
PIN_HELD_SECONDS = "continuum_pin_held_seconds"
