package fsm

// DeletedRegisterMemory is how many recent fenced deletes the state
// remembers, over all keys, each with the token a later write to its key
// must reach. When a delete is dropped from this memory (the oldest goes
// first), its token raises the register floor: no register is created with
// a token below the floor, so the dropped key still refuses every token
// its delete refused.
const DeletedRegisterMemory = 10_000

// deletedReg is one remembered delete, in a list from the oldest to the
// newest.
type deletedReg struct {
	key   string
	token uint64
	// lock: the lock the key's register was bound to ("" none).
	lock       string
	prev, next *deletedReg
}

// deletedRegs is the bounded memory of fenced deletes and the floor it
// leaves behind: a map for lookups and a list for the order of deletes,
// so that forgetting a key (its register is written again) is O(1) and
// the list holds exactly the remembered deletes. Equal logs give equal
// lists.
type deletedRegs struct {
	byKey      map[string]*deletedReg
	head, tail *deletedReg // oldest, newest
	floor      uint64
}

// fence is the token a write must reach to create the register key, which
// has none: its remembered delete's token, and at least the floor.
func (d *deletedRegs) fence(key string) uint64 {
	if e := d.byKey[key]; e != nil {
		return max(e.token, d.floor)
	}
	return d.floor
}

// lockOf is the lock key's deleted register was bound to ("" none, or
// not remembered). A dropped delete's binding is forgotten with it.
func (d *deletedRegs) lockOf(key string) string {
	if e := d.byKey[key]; e != nil {
		return e.lock
	}
	return ""
}

// record remembers a delete of key with token, bound to lock ("" none),
// as the newest one, dropping the oldest when the memory is full and
// raising the floor to its token.
func (d *deletedRegs) record(key string, token uint64, lock string) {
	if e := d.byKey[key]; e != nil {
		token = max(token, e.token)
		if e.lock != "" {
			lock = e.lock
		}
		d.forget(key)
	}
	if d.byKey == nil {
		d.byKey = make(map[string]*deletedReg)
	}
	e := &deletedReg{key: key, token: token, lock: lock, prev: d.tail}
	if d.tail != nil {
		d.tail.next = e
	} else {
		d.head = e
	}
	d.tail = e
	d.byKey[key] = e
	if len(d.byKey) > DeletedRegisterMemory {
		old := d.head
		d.floor = max(d.floor, old.token)
		d.forget(old.key)
	}
}

// forget drops key's remembered delete, if any.
func (d *deletedRegs) forget(key string) {
	e := d.byKey[key]
	if e == nil {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		d.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		d.tail = e.prev
	}
	delete(d.byKey, key)
}

// each calls fn for every remembered delete, oldest first.
func (d *deletedRegs) each(fn func(key string, token uint64, lock string)) {
	for e := d.head; e != nil; e = e.next {
		fn(e.key, e.token, e.lock)
	}
}
