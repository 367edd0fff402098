module github.com/tenure-io/tenure/client

go 1.26.8

require (
	github.com/tenure-io/tenure/api v0.0.0-00010101000000-000000000000
	github.com/tenure-io/tenure/fenceproof v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

// For development the client builds against the api and fenceproof
// modules of the same checkout; a release tags all of them together (see
// docs/client.md).
replace (
	github.com/tenure-io/tenure/api => ../api
	github.com/tenure-io/tenure/fenceproof => ../fenceproof
)
