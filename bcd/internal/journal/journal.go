// Package journal is bcd's state on disk: one bbolt file holding the node's identity, the last
// desired state and the generation applied, the command results not yet acknowledged and how far
// each command got. Every write is a bbolt transaction, so a kill -9 at any moment loses nothing
// that was written.
package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// Version is the journal's format; Open upgrades older ones and refuses newer ones.
const Version = 1

var (
	bucketMeta     = []byte("meta")
	bucketIdentity = []byte("identity")
	bucketDesired  = []byte("desired")
	bucketResults  = []byte("results")
	bucketCommands = []byte("commands")

	keyVersion  = []byte("version")
	keyIdentity = []byte("identity")
	keyState    = []byte("state")
	keyApplied  = []byte("applied")
)

// ErrLocked is returned by Open when another process (a running bcd node) holds the journal.
var ErrLocked = errors.New("journal: in use by another bcd process")

// Journal is a nodeagent.Store in a bbolt file.
type Journal struct {
	db   *bolt.DB
	path string
}

var _ nodeagent.Store = (*Journal)(nil)

// Path is where the journal of a state directory is.
func Path(dir string) string { return filepath.Join(dir, "journal.db") }

// Open opens (creating it if missing) the journal in dir. A journal that does not open is
// reported, never replaced: its state would be lost.
func Open(dir string) (*Journal, error) { return open(dir, false) }

// OpenReadOnly opens an existing journal to read it.
func OpenReadOnly(dir string) (*Journal, error) { return open(dir, true) }

func open(dir string, readOnly bool) (*Journal, error) {
	path := Path(dir)
	if readOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("journal: %s: %w (has this node joined? run bcd join)", path, err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal: state directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: readOnly})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w (%s)", ErrLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("journal: %s does not open (%v); it is left as it is: move it aside and run bcd join again to start over", path, err)
	}
	j := &Journal{db: db, path: path}
	if !readOnly {
		if err := j.upgrade(); err != nil {
			db.Close()
			return nil, err
		}
	}
	return j, nil
}

// Path is the journal's file.
func (j *Journal) Path() string { return j.path }

// Close closes the file.
func (j *Journal) Close() error { return j.db.Close() }

func (j *Journal) upgrade() error {
	return j.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketIdentity, bucketDesired, bucketResults, bucketCommands} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		v := meta.Get(keyVersion)
		switch {
		case v == nil:
			return meta.Put(keyVersion, u64(Version))
		case binary.BigEndian.Uint64(v) > Version:
			return fmt.Errorf("journal: %s is of version %d, newer than this bcd understands (%d); run a newer bcd", j.path, binary.BigEndian.Uint64(v), Version)
		}
		// Version 1 is the first: nothing to upgrade yet.
		return nil
	})
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// bucket returns a bucket, or nil in a read-only journal that predates it.
func bucket(tx *bolt.Tx, name []byte) *bolt.Bucket { return tx.Bucket(name) }

// Identity implements nodeagent.Store.
func (j *Journal) Identity() (id nodeagent.Identity, ok bool, err error) {
	err = j.db.View(func(tx *bolt.Tx) error {
		b := bucket(tx, bucketIdentity)
		if b == nil {
			return nil
		}
		raw := b.Get(keyIdentity)
		if raw == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(raw, &id)
	})
	return id, ok, err
}

// SetIdentity implements nodeagent.Store.
func (j *Journal) SetIdentity(id nodeagent.Identity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return j.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketIdentity).Put(keyIdentity, b) })
}

// Desired implements nodeagent.Store.
func (j *Journal) Desired() (ds *agentv1.DesiredState, applied int64, err error) {
	err = j.db.View(func(tx *bolt.Tx) error {
		b := bucket(tx, bucketDesired)
		if b == nil {
			return nil
		}
		if a := b.Get(keyApplied); a != nil {
			applied = int64(binary.BigEndian.Uint64(a))
		}
		raw := b.Get(keyState)
		if raw == nil {
			return nil
		}
		ds = &agentv1.DesiredState{}
		return proto.Unmarshal(raw, ds)
	})
	return ds, applied, err
}

// SetDesired implements nodeagent.Store.
func (j *Journal) SetDesired(ds *agentv1.DesiredState, applied int64) error {
	raw, err := proto.Marshal(ds)
	if err != nil {
		return err
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDesired)
		if err := b.Put(keyState, raw); err != nil {
			return err
		}
		return b.Put(keyApplied, u64(uint64(applied)))
	})
}

// Results implements nodeagent.Store.
func (j *Journal) Results() (out []*agentv1.CommandResult, err error) {
	err = j.db.View(func(tx *bolt.Tx) error {
		b := bucket(tx, bucketResults)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			r := &agentv1.CommandResult{}
			if err := proto.Unmarshal(v, r); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// PutResult implements nodeagent.Store: the result and the command's being done are one write.
func (j *Journal) PutResult(r *agentv1.CommandResult) error {
	raw, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketResults).Put([]byte(r.GetCommandId()), raw); err != nil {
			return err
		}
		return tx.Bucket(bucketCommands).Put([]byte(r.GetCommandId()), []byte{byte(nodeagent.CommandDone)})
	})
}

// DeleteResult implements nodeagent.Store.
func (j *Journal) DeleteResult(id string) error {
	return j.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketResults).Delete([]byte(id)) })
}

// CommandState implements nodeagent.Store.
func (j *Journal) CommandState(id string) (s nodeagent.CommandState, err error) {
	err = j.db.View(func(tx *bolt.Tx) error {
		if b := bucket(tx, bucketCommands); b != nil {
			if v := b.Get([]byte(id)); len(v) == 1 {
				s = nodeagent.CommandState(v[0])
			}
		}
		return nil
	})
	return s, err
}

// MarkStarted implements nodeagent.Store.
func (j *Journal) MarkStarted(id string) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCommands)
		if b.Get([]byte(id)) != nil {
			return nil
		}
		return b.Put([]byte(id), []byte{byte(nodeagent.CommandStarted)})
	})
}
