// Node's etcd3 client (the npm package, unmodified) against Tenure's etcd
// API at ETCD_ENDPOINT: KV, lock, lease, election and watch. Run by
// TestNodeEtcd3 with node's own test runner.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Etcd3, EtcdLockFailedError } from 'etcd3';

const client = new Etcd3({ hosts: 'http://' + process.env.ETCD_ENDPOINT });
after(() => client.close());

// eventually polls fn until it returns true, for at most ms.
async function eventually(what, fn, ms = 10000) {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('kv', async () => {
  await client.put('node/a').value('1');
  await client.put('node/b').value('2');
  assert.equal(await client.get('node/a').string(), '1');
  assert.deepEqual(await client.getAll().prefix('node/').strings(), { 'node/a': '1', 'node/b': '2' });
  assert.equal(await client.getAll().prefix('node/').count(), 2);
  const sorted = await client.getAll().prefix('node/').sort('Value', 'Descend').keys();
  assert.deepEqual(sorted, ['node/b', 'node/a']);
  const res = await client
    .if('node/a', 'Value', '==', '1')
    .then(client.put('node/a').value('3'))
    .else(client.get('node/a'))
    .commit();
  assert.equal(res.succeeded, true);
  assert.equal(await client.get('node/a').string(), '3');
  await client.delete().prefix('node/');
  assert.equal(await client.getAll().prefix('node/').count(), 0);
});

test('lock', async () => {
  const held = client.lock('node-lock');
  await held.acquire();
  await assert.rejects(client.lock('node-lock').acquire(), EtcdLockFailedError);
  await held.release();
  let ran = false;
  await client.lock('node-lock').do(async () => {
    ran = true;
  });
  assert.equal(ran, true);
});

test('lease', async () => {
  const lease = client.lease(10);
  await lease.put('node/leased').value('x');
  assert.equal(await client.get('node/leased').string(), 'x');
  const id = await lease.grant();
  const ttl = await client.leaseClient.leaseTimeToLive({ ID: id, keys: true });
  assert.equal(Number(ttl.grantedTTL), 10);
  assert.deepEqual(ttl.keys.map((k) => k.toString()), ['node/leased']);
  await lease.keepaliveOnce();
  await lease.revoke();
  assert.equal(await client.get('node/leased').string(), null);
});

test('election', async () => {
  const election = client.election('node-election');
  const observer = await election.observe();
  const seen = [];
  observer.on('change', (v) => seen.push(v));
  const first = election.campaign('alice');
  await new Promise((resolve, reject) => {
    first.on('elected', resolve);
    first.on('error', reject);
  });
  const second = election.campaign('bob');
  await eventually('the observer sees alice', () => observer.leader() === 'alice');
  await first.resign();
  await new Promise((resolve, reject) => {
    second.on('elected', resolve);
    second.on('error', reject);
  });
  await eventually('the observer sees bob', () => observer.leader() === 'bob');
  assert.ok(seen.includes('alice') && seen.includes('bob'), `changes seen: ${seen}`);
  await second.resign();
  await observer.cancel();
});

test('watch', async () => {
  const watcher = await client.watch().prefix('node/w/').withPreviousKV().create();
  const events = [];
  watcher.on('put', (kv, prev) => events.push(`put ${kv.key}=${kv.value} prev=${prev ? prev.value : ''}`));
  watcher.on('delete', (kv, prev) => events.push(`delete ${kv.key} prev=${prev ? prev.value : ''}`));
  await client.put('node/w/k').value('1');
  await client.put('node/w/k').value('2');
  await client.delete().key('node/w/k');
  await eventually('the watch events', () => events.length === 3);
  assert.deepEqual(events, ['put node/w/k=1 prev=', 'put node/w/k=2 prev=1', 'delete node/w/k prev=2']);
  await watcher.cancel();
});
