# Tenure's build targets. `make test` is what CI runs.
GOBIN ?= $(shell go env GOPATH)/bin

.PHONY: test proto proto-tools build

test:
	go vet ./...
	go test -race -timeout 10m ./...

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
