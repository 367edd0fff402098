package server

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestCommandBuildsItsOwnOp: every operation command accepts becomes the
// command of its own type (a case wired to the wrong field would apply
// another command), the settle types name theirs, and an operation with
// no command is an error, not a panic.
func TestCommandBuildsItsOwnOp(t *testing.T) {
	oneof := (&fsmpb.Command{}).ProtoReflect().Descriptor().Oneofs().ByName("op")
	uses := map[protoreflect.FullName]int{}
	for i := range oneof.Fields().Len() {
		uses[oneof.Fields().Get(i).Message().FullName()]++
	}
	built := 0
	for i := range oneof.Fields().Len() {
		f := oneof.Fields().Get(i)
		if uses[f.Message().FullName()] > 1 {
			continue // shared argument types: below
		}
		op := (&fsmpb.Command{}).ProtoReflect().NewField(f).Message().Interface()
		cmd, err := command(op)
		if errors.Is(err, errNoCommand) {
			continue // not proposed by the server
		}
		if err != nil {
			t.Fatalf("%s: %v", f.Name(), err)
		}
		if got := cmd.ProtoReflect().WhichOneof(oneof); got == nil || got.Name() != f.Name() {
			t.Errorf("%T built command %v, want %s", op, got, f.Name())
		}
		built++
	}
	if built < 30 {
		t.Errorf("command built %d kinds of command, want at least 30", built)
	}
	for op, want := range map[any]protoreflect.Name{
		queueAck{&fsmpb.QueueSettle{}}:            "queue_ack",
		queueNack{&fsmpb.QueueSettle{}}:           "queue_nack",
		queueAckBatch{&fsmpb.QueueSettleBatch{}}:  "queue_ack_batch",
		queueNackBatch{&fsmpb.QueueSettleBatch{}}: "queue_nack_batch",
	} {
		cmd, err := command(op)
		if err != nil {
			t.Fatalf("%T: %v", op, err)
		}
		if got := cmd.ProtoReflect().WhichOneof(oneof); got == nil || got.Name() != want {
			t.Errorf("%T built command %v, want %s", op, got, want)
		}
	}
	for _, op := range []any{&fsmpb.QueueSettle{}, &fsmpb.Command{}, nil, "acquire"} {
		if _, err := command(op); !errors.Is(err, errNoCommand) {
			t.Errorf("command(%T) = %v, want errNoCommand", op, err)
		}
	}
}
