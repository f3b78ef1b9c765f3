package sharding

import "errors"

// ErrInvalid reports an argument that cannot work: a negative length, a
// degree below 1, a rank out of range, an unknown stage.
var ErrInvalid = errors.New("sharding: invalid argument")

// ErrMismatch reports shards or a checkpoint that do not fit the partition
// they are used with: another flat length, other tensors, a shard of the
// wrong rank or length, vectors that differ between shards.
var ErrMismatch = errors.New("sharding: mismatch")

// ErrCorrupt reports a checkpoint file that cannot be trusted: a checksum
// that does not match, a truncated or missing shard file, a malformed
// manifest or shard header.
var ErrCorrupt = errors.New("sharding: corrupt checkpoint")

// ErrIncomplete reports a checkpoint step directory without a manifest: its
// writers did not finish, so it must not be loaded.
var ErrIncomplete = errors.New("sharding: incomplete checkpoint")

// ErrNoCheckpoint reports a checkpoint root that holds no complete
// checkpoint.
var ErrNoCheckpoint = errors.New("sharding: no complete checkpoint")

// ErrFenced reports a checkpoint write by a generation of a job that a
// later generation has replaced: its state must not overwrite or join the
// newer one's.
var ErrFenced = errors.New("sharding: fenced by a later generation")
