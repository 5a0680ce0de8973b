"""The vLLM release the shared reference (../shared/reference: setup.sh,
vllm_replay.py) installs: the release of every committed golden outside
goldens_0_34/ and the live comparers' default. kvsched's own default
(kvsched.vllm_versions.DEFAULT_VLLM_VERSION) is the newest release it
models, so the 0.33 corpus names its release here, once."""

SHARED_REFERENCE_VERSION = "0.33"
