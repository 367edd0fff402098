package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// errNoCommand: an operation has no replicated command (a programming
// error: the request fails with INTERNAL, the server goes on).
var errNoCommand = errors.New("server: no command for this operation")

// The queue's settle commands share their argument types; these name
// which command an argument is for.
type (
	queueAck       struct{ *fsmpb.QueueSettle }
	queueNack      struct{ *fsmpb.QueueSettle }
	queueAckBatch  struct{ *fsmpb.QueueSettleBatch }
	queueNackBatch struct{ *fsmpb.QueueSettleBatch }
	// setClientAddr: a member's Tenure API address (clientaddr.go).
	setClientAddr struct{ *fsmpb.SetEtcdURL }
)

// command is the one way the server builds a replicated command from its
// operation (an fsmpb message, or one of the settle types above). An
// operation with no command is an error, never a panic.
func command(op any) (*fsmpb.Command, error) {
	var c fsmpb.Command
	switch o := op.(type) {
	case *fsmpb.CreateSession:
		c.Op = &fsmpb.Command_CreateSession{CreateSession: o}
	case *fsmpb.CloseSession:
		c.Op = &fsmpb.Command_CloseSession{CloseSession: o}
	case *fsmpb.Acquire:
		c.Op = &fsmpb.Command_Acquire{Acquire: o}
	case *fsmpb.CancelAcquire:
		c.Op = &fsmpb.Command_CancelAcquire{CancelAcquire: o}
	case *fsmpb.Release:
		c.Op = &fsmpb.Command_Release{Release: o}
	case *fsmpb.FencedPut:
		c.Op = &fsmpb.Command_FencedPut{FencedPut: o}
	case *fsmpb.FencedDelete:
		c.Op = &fsmpb.Command_FencedDelete{FencedDelete: o}
	case *fsmpb.Proclaim:
		c.Op = &fsmpb.Command_Proclaim{Proclaim: o}
	case *fsmpb.KVPut:
		c.Op = &fsmpb.Command_KvPut{KvPut: o}
	case *fsmpb.KVDelete:
		c.Op = &fsmpb.Command_KvDelete{KvDelete: o}
	case *fsmpb.KVTxn:
		c.Op = &fsmpb.Command_KvTxn{KvTxn: o}
	case *fsmpb.KVHistoryCompact:
		c.Op = &fsmpb.Command_KvCompact{KvCompact: o}
	case *fsmpb.QueueEnqueue:
		c.Op = &fsmpb.Command_QueueEnqueue{QueueEnqueue: o}
	case *fsmpb.QueueDequeue:
		c.Op = &fsmpb.Command_QueueDequeue{QueueDequeue: o}
	case queueAck:
		c.Op = &fsmpb.Command_QueueAck{QueueAck: o.QueueSettle}
	case queueNack:
		c.Op = &fsmpb.Command_QueueNack{QueueNack: o.QueueSettle}
	case *fsmpb.QueueExtend:
		c.Op = &fsmpb.Command_QueueExtend{QueueExtend: o}
	case *fsmpb.QueueRequeueDead:
		c.Op = &fsmpb.Command_QueueRequeueDead{QueueRequeueDead: o}
	case *fsmpb.QueuePurge:
		c.Op = &fsmpb.Command_QueuePurge{QueuePurge: o}
	case *fsmpb.QueueDelete:
		c.Op = &fsmpb.Command_QueueDelete{QueueDelete: o}
	case *fsmpb.QueueEnqueueBatch:
		c.Op = &fsmpb.Command_QueueEnqueueBatch{QueueEnqueueBatch: o}
	case *fsmpb.QueueDequeueBatch:
		c.Op = &fsmpb.Command_QueueDequeueBatch{QueueDequeueBatch: o}
	case queueAckBatch:
		c.Op = &fsmpb.Command_QueueAckBatch{QueueAckBatch: o.QueueSettleBatch}
	case queueNackBatch:
		c.Op = &fsmpb.Command_QueueNackBatch{QueueNackBatch: o.QueueSettleBatch}
	case *fsmpb.AclBootstrap:
		c.Op = &fsmpb.Command_AclBootstrap{AclBootstrap: o}
	case *fsmpb.AclPolicySet:
		c.Op = &fsmpb.Command_AclPolicySet{AclPolicySet: o}
	case *fsmpb.AclPolicyDelete:
		c.Op = &fsmpb.Command_AclPolicyDelete{AclPolicyDelete: o}
	case *fsmpb.AclTokenCreate:
		c.Op = &fsmpb.Command_AclTokenCreate{AclTokenCreate: o}
	case *fsmpb.AclTokenRevoke:
		c.Op = &fsmpb.Command_AclTokenRevoke{AclTokenRevoke: o}
	case *fsmpb.AclBindingSet:
		c.Op = &fsmpb.Command_AclBindingSet{AclBindingSet: o}
	case *fsmpb.AclBindingDelete:
		c.Op = &fsmpb.Command_AclBindingDelete{AclBindingDelete: o}
	case *fsmpb.AddSigningKey:
		c.Op = &fsmpb.Command_AddSigningKey{AddSigningKey: o}
	case *fsmpb.AclEnable:
		c.Op = &fsmpb.Command_AclEnable{AclEnable: o}
	case *fsmpb.RetireSigningKey:
		c.Op = &fsmpb.Command_RetireSigningKey{RetireSigningKey: o}
	case *fsmpb.RemoveSigningKey:
		c.Op = &fsmpb.Command_RemoveSigningKey{RemoveSigningKey: o}
	case *fsmpb.SetEtcdURL:
		c.Op = &fsmpb.Command_SetEtcdUrl{SetEtcdUrl: o}
	case setClientAddr:
		c.Op = &fsmpb.Command_SetClientAddr{SetClientAddr: o.SetEtcdURL}
	case *fsmpb.AclTokenUpdate:
		c.Op = &fsmpb.Command_AclTokenUpdate{AclTokenUpdate: o}
	case *fsmpb.ZkTxn:
		c.Op = &fsmpb.Command_ZkTxn{ZkTxn: o}
	case ZkSetAddr:
		c.Op = &fsmpb.Command_ZkSetAddr{ZkSetAddr: o.SetEtcdURL}
	case *fsmpb.SetSessionTTL:
		c.Op = &fsmpb.Command_SetSessionTtl{SetSessionTtl: o}
	default:
		return nil, fmt.Errorf("%w: %T", errNoCommand, op)
	}
	return &c, nil
}

// proposeOp builds op's command and commits it within ctx.
func (s *Server) proposeOp(ctx context.Context, op any) (fsm.Result, error) {
	cmd, err := command(op)
	if err != nil {
		return fsm.Result{}, err
	}
	return s.node.Propose(ctx, cmd)
}

// proposeDetached commits op with a context detached from the client's:
// once a command is sent its outcome must be known, so it is not
// abandoned halfway (bounded by cleanupTimeout).
func (s *Server) proposeDetached(op any) (fsm.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	return s.proposeOp(ctx, op)
}

// proposeAsync builds op's command and proposes it without waiting; done
// gets the outcome (node.ProposeAsync), or at once the build's error.
func (s *Server) proposeAsync(op any, done func(fsm.Result, error)) {
	cmd, err := command(op)
	if err != nil {
		done(fsm.Result{}, err)
		return
	}
	s.node.ProposeAsync(cmd, done)
}
