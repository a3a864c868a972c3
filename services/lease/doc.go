// Package lease is tenure's lease service: per range, the current epoch, the
// lease of that epoch and the range's membership, all kept in etcd, plus the
// Keeper that replica leaders use to keep their leases alive.
//
// # State
//
// Everything lives in etcd; a Service holds no state etcd does not (only its
// configuration and the etcd minimum lease TTL it has observed). Several
// instances can serve one etcd at once, and a restarted instance, or one
// talking to a new etcd leader, carries on exactly where the last left off.
// Every decision that matters is a single etcd transaction whose compare
// covers what the decision depends on.
//
// # Key layout
//
// Under a configurable prefix (default "/tenure/"). Range and holder ids
// follow wire.ValidateRangeID, which excludes '/', so every key below parses
// unambiguously. The values are part of the storage format: change them only
// with a migration plan.
//
//	<prefix>epochs/<range>            current epoch, decimal ASCII ("0" = no grant yet).
//	                                  Written "0" by CreateRange, then only by
//	                                  GrantEpoch's compare-and-swap. Never deleted:
//	                                  a deleted epoch key would let epochs restart.
//	<prefix>leases/<range>            JSON leaseRecord {epoch, holder_id,
//	                                  holder_address, session_id, released}.
//	                                  Attached to the holder session's etcd lease,
//	                                  so it disappears when the session expires.
//	                                  A released lease is rewritten with
//	                                  released=true and no etcd lease.
//	<prefix>members/<range>           JSON membersRecord {replicas, preferred_replica_id};
//	                                  its mod revision is the membership revision.
//	<prefix>retention/<range>         JSON retentionRecord {max_bytes, max_age_ms},
//	                                  both always written (0 = unlimited).
//	                                  CreateRange writes it (the defaults when the
//	                                  request names none), SetRetention replaces it,
//	                                  DeleteRange deletes it. Its own key, so a
//	                                  policy change never moves the membership
//	                                  revision. Absent (a range created before
//	                                  retention existed): reads as the defaults.
//	<prefix>sessions/<holder>/<id>    JSON sessionRecord {holder_id, holder_address,
//	                                  ttl_ms, closing}; <id> is the etcd lease id in
//	                                  16 hex digits. Attached to that etcd lease, so
//	                                  the live sessions of a holder are exactly the
//	                                  keys under sessions/<holder>/, and the newest
//	                                  is the one with the highest create revision.
//
// Epochs get their own subtree so that one range read over
// epochs/<first held>..epochs/<last held> answers a keep-alive for a holder
// of a thousand ranges, instead of a thousand gets.
//
// Invariant: a lease record's epoch equals its range's current epoch.
// GrantEpoch writes both in one transaction; BindLease and ReleaseLease
// compare the epoch key in the transaction that writes the lease.
//
// # Events
//
// WatchLeases is one etcd watch on the whole prefix (one watch keeps etcd's
// revision order across ranges), translated into at most one event per range
// per revision:
//
//	epochs/<range> put, epoch > 0      GRANTED (holder from the lease written in the same txn)
//	leases/<range> put, not released   BOUND
//	leases/<range> put, released       RELEASED (ReleaseLease)
//	leases/<range> delete              EXPIRED, or RELEASED if the session was closed
//	members/<range> put                MEMBERSHIP (CreateRange, SetReplicas; epoch 0)
//
// Every event carries the etcd revision of its change. One revision can
// carry events of many ranges: a session that expires or is closed loses all
// its leases in one etcd transaction. A watcher resuming with after_revision
// R gets everything after R, so one that may have lost its stream in the
// middle of a revision's events should resume from R-1 and skip the
// (range, revision) pairs it already has.
//
// EXPIRED and RELEASED are told apart by what is written, never by timing.
// ReleaseLease does not delete the lease key: it overwrites it with a
// released record, so its event is a put. A lease key is deleted only when
// etcd revokes the session's lease, which deletes every key attached to it,
// the session record included, in one revision. CloseSession first marks
// the session record closing, then revokes; the watcher reads the deleted
// session record (prev kv) in the same revision, and reports the lease
// deletions of a closing session as RELEASED. A deletion whose session was not
// marked closing is an expiry (or a revoke done behind the service's back,
// which to a watcher is the same thing: nobody handed the lease over).
package lease
