# Tenure's build targets. `make test` is what CI runs: every test, with
# the tenurefault build tag that gives the fault-injection tests their
# switches (a normal `go build ./cmd/tenure` has none; cmd/tenure's test
# checks). The quick gate is `go test -short ./...`: no PostgreSQL, no
# fault suite, no binaries built.
GOBIN ?= $(shell go env GOPATH)/bin

# Modules of their own in this repository that the server depends on
# (through replace directives in go.mod): the Go client and the packages it
# imports. `go test ./...` at the root does not enter them, so test runs
# each. The client's module graph stays free of the server's dependencies
# (internal/clienttest's TestClientModuleIsLight checks it).
MODULES := api fenceproof client

.PHONY: test proto proto-tools build

test:
	go vet ./...
	go vet -tags tenurefault ./...
	for m in $(MODULES); do (cd $$m && go vet ./... && go test -race -timeout 5m ./...) || exit 1; done
	go test -race -tags tenurefault -timeout 10m ./...

build:
	go build -o bin/tenure ./cmd/tenure

proto-tools:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0

# proto regenerates the committed Go code from the .proto files. Needs protoc
# (Debian: protobuf-compiler) and the plugins from `make proto-tools`; works offline.
proto:
	PATH="$(GOBIN):$$PATH" protoc -I . --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. \
		api/tenurepb/tenure.proto internal/fsm/fsmpb/fsm.proto
