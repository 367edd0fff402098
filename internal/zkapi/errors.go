package zkapi

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
)

// grpcCode is the gRPC code a ZooKeeper answer counts under in Tenure's
// request metrics (tenure_rpc_requests_total): the one place ZooKeeper's
// codes meet gRPC's.
func grpcCode(code fsm.ZkCode) codes.Code {
	switch code {
	case fsm.ZkOK:
		return codes.OK
	case fsm.ZkNoNode, fsm.ZkSessionExpired, codeNoWatcher:
		return codes.NotFound
	case fsm.ZkNodeExists:
		return codes.AlreadyExists
	case fsm.ZkBadVersion, fsm.ZkNotEmpty, fsm.ZkNoChildrenForEphemerals:
		return codes.FailedPrecondition
	case fsm.ZkNoAuth, codeAuthFailed:
		return codes.PermissionDenied
	case fsm.ZkBadArguments, fsm.ZkInvalidACL, codeMarshalling:
		return codes.InvalidArgument
	case fsm.ZkQuotaExceeded:
		return codes.ResourceExhausted
	case fsm.ZkUnimplemented:
		return codes.Unimplemented
	}
	return codes.Internal
}

// opNames are the method labels of ZooKeeper's requests: "zk." and
// ZooKeeper's name of the op (a fixed set; others count as zk.other).
var opNames = map[int32]string{
	opCreate: "zk.create", opCreate2: "zk.create2", opCreateContainer: "zk.createContainer", opCreateTTL: "zk.createTTL",
	opDelete: "zk.delete", opExists: "zk.exists", opGetData: "zk.getData", opSetData: "zk.setData",
	opGetACL: "zk.getACL", opSetACL: "zk.setACL", opGetChildren: "zk.getChildren", opGetChildren2: "zk.getChildren2",
	opSync: "zk.sync", opPing: "zk.ping", opCheck: "zk.check", opMulti: "zk.multi", opMultiRead: "zk.multiRead",
	opAuth: "zk.auth", opSetWatches: "zk.setWatches", opSetWatches2: "zk.setWatches2", opAddWatch: "zk.addWatch",
	opRemoveWatches: "zk.removeWatches", opCheckWatches: "zk.checkWatches", opGetEphemerals: "zk.getEphemerals",
	opGetAllChildren: "zk.getAllChildrenNumber", opWhoAmI: "zk.whoAmI", opCloseSession: "zk.closeSession",
}

// answered counts the answer of the request being served.
func (c *conn) answered(xid int32, code fsm.ZkCode) {
	if !c.cur.pending || xid != c.cur.xid {
		return
	}
	c.cur.pending = false
	name, ok := opNames[c.cur.op]
	if !ok {
		name = "zk.other"
	}
	var err error
	if gc := grpcCode(code); gc != codes.OK {
		err = status.Errorf(gc, "zookeeper code %d", code)
	}
	c.z.srv.Answered(name, err, true, time.Since(c.cur.start))
}
