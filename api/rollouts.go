package api

import (
	"time"

	"github.com/google/uuid"
)

// ResourceRollout is the IAM resource type of rollouts of bcd releases to pools.
const ResourceRollout = "compute-rollout"

// The desired-state part that tells a node which release of bcd to run (docs/releases.md). It
// is optional: a node whose bcd predates self-update ignores it.
const (
	BCDReleaseKind    = "bcd.release"
	BCDReleaseVersion = 1
)

// BCDRelease is the payload of the bcd.release part.
type BCDRelease struct {
	Version string `json:"version"`
	// Rollout and Attempt name the try: a node that rolled Version back does not install it
	// again for the same try, only for a new one (rollouts.resume tries a failed wave again).
	Rollout string `json:"rollout,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
}

// The rollouts group: a release rolled out to a pool's nodes in waves (docs/releases.md).
var (
	RolloutsCreate   = NewMethod[CreateRollout, Rollout]("rollouts", "create", true, ResourceRollout, "v0.4", "Roll a release of bcd out to a pool in waves, each within the pool's disruption budget and gated on its nodes coming back on the new version.")
	RolloutsGet      = NewMethod[RolloutRef, Rollout]("rollouts", "get", false, ResourceRollout, "v0.4", "Get a rollout: its waves and every node's progress.")
	RolloutsList     = NewMethod[ListRollouts, Page[Rollout]]("rollouts", "list", false, ResourceRollout, "v0.4", "List a tenant's rollouts, newest first, by pool and state.")
	RolloutsPause    = NewMethod[RolloutRef, Rollout]("rollouts", "pause", true, ResourceRollout, "v0.4", "Pause a rollout: no new wave starts until it is resumed.")
	RolloutsResume   = NewMethod[RolloutRef, Rollout]("rollouts", "resume", true, ResourceRollout, "v0.4", "Resume a paused rollout; the nodes of a failed wave are tried again, with a new deadline.")
	RolloutsRollback = NewMethod[RolloutRef, Rollout]("rollouts", "rollback", true, ResourceRollout, "v0.4", "Send the nodes a rollout touched back to the releases they ran before it, and stop it.")
)

// RolloutMethods returns the rollouts group.
func RolloutMethods() []MethodInfo { return infos(rolloutTable()) }

func rolloutTable() []Describer {
	return []Describer{RolloutsCreate, RolloutsGet, RolloutsList, RolloutsPause, RolloutsResume, RolloutsRollback}
}

// The states of a rollout.
const (
	RolloutRunning     = "running"
	RolloutPaused      = "paused"
	RolloutSucceeded   = "succeeded"
	RolloutRollingBack = "rolling_back"
	RolloutRolledBack  = "rolled_back"
	RolloutFailed      = "failed" // a rollback whose nodes did not come back in time
)

// What a rollout does when a wave fails.
const (
	OnFailurePause    = "pause"
	OnFailureRollback = "rollback"
)

// The states of a wave.
const (
	WaveRunning   = "running"
	WaveSucceeded = "succeeded"
	WaveFailed    = "failed"
)

// The states of a node in a rollout.
const (
	RolloutNodePending   = "pending"   // not in a wave yet
	RolloutNodeUpdating  = "updating"  // told the release; not back on it yet
	RolloutNodeUpdated   = "updated"   // back online on the release
	RolloutNodeFailed    = "failed"    // not back on it by its wave's deadline
	RolloutNodeReverting = "reverting" // told its release of before
	RolloutNodeReverted  = "reverted"  // back on its release of before
	RolloutNodeSkipped   = "skipped"   // never updated: the rollout stopped before its wave
)

// Defaults and limits of rollouts.
const (
	DefaultRolloutWaveDeadline = 10 * time.Minute
	MaxRolloutWaveDeadline     = 24 * time.Hour
	MaxRolloutUnavailable      = 10000
)

// CreateRollout is the input of rollouts.create.
type CreateRollout struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"`    // id or name
	Release  string `json:"release"` // a published release's version
	// MaxUnavailable is the pool's disruption budget: how many of its nodes may be unavailable
	// at once, those already offline counted. A wave updates at most that many. Default 1.
	MaxUnavailable int `json:"maxUnavailable,omitempty"`
	// WaveDeadline is how long a wave's nodes have to come back online on the release. Default
	// 10m.
	WaveDeadline string `json:"waveDeadline,omitempty"`
	// OnFailure is what a failed wave does: pause (the default) or rollback.
	OnFailure string `json:"onFailure,omitempty"`
}

// Validate implements the input check of rollouts.create.
func (in CreateRollout) Validate() error {
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if err := ValidateReleaseVersion("release", in.Release); err != nil {
		return err
	}
	if in.MaxUnavailable < 0 || in.MaxUnavailable > MaxRolloutUnavailable {
		return InvalidField("maxUnavailable", "must be between 1 and %d (0 means 1), got %d", MaxRolloutUnavailable, in.MaxUnavailable)
	}
	if in.WaveDeadline != "" {
		d, err := ParseDuration("waveDeadline", in.WaveDeadline)
		if err != nil {
			return err
		}
		if d < 10*time.Second || d > MaxRolloutWaveDeadline {
			return InvalidField("waveDeadline", "must be between 10s and %s, got %s", MaxRolloutWaveDeadline, in.WaveDeadline)
		}
	}
	return ValidateEnum("onFailure", in.OnFailure, OnFailurePause, OnFailureRollback)
}

// Deadline is WaveDeadline with its default.
func (in CreateRollout) Deadline() time.Duration {
	if in.WaveDeadline == "" {
		return DefaultRolloutWaveDeadline
	}
	d, _ := time.ParseDuration(in.WaveDeadline)
	return d
}

// RolloutRef names a rollout.
type RolloutRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Rollout  string `json:"rollout"`
}

// Validate implements the input check.
func (in RolloutRef) Validate() error {
	if uuid.Validate(in.Rollout) != nil {
		return InvalidField("rollout", "%q is not a rollout's id (rollouts.list)", in.Rollout)
	}
	return nil
}

// ListRollouts is the input of rollouts.list.
type ListRollouts struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool,omitempty"`
	State    string `json:"state,omitempty"`
	PageRequest
}

// Validate implements the input check of rollouts.list.
func (in ListRollouts) Validate() error {
	if in.Pool != "" {
		if err := ValidateRef("pool", in.Pool); err != nil {
			return err
		}
	}
	if err := ValidateEnum("state", in.State, RolloutRunning, RolloutPaused, RolloutSucceeded, RolloutRollingBack, RolloutRolledBack, RolloutFailed); err != nil {
		return err
	}
	return in.PageRequest.Validate()
}

// Rollout is a release rolled out to a pool in waves.
type Rollout struct {
	ID             string `json:"id"`
	TenantID       string `json:"tenantId"`
	PoolID         string `json:"poolId"`
	Release        string `json:"release"`
	MaxUnavailable int    `json:"maxUnavailable"`
	WaveDeadline   string `json:"waveDeadline"`
	OnFailure      string `json:"onFailure"`
	State          string `json:"state"`
	// Wave is the wave in flight, or the last one; 0 before the first.
	Wave int `json:"wave"`
	// Progress: how many of the pool's nodes the rollout covers, and how many are on the
	// release.
	Total      int           `json:"total"`
	Updated    int           `json:"updated"`
	Note       string        `json:"note,omitempty"` // what it waits for
	Error      string        `json:"error,omitempty"`
	Waves      []RolloutWave `json:"waves"`
	Nodes      []RolloutNode `json:"nodes"`
	CreatedBy  string        `json:"createdBy"`
	CreatedAt  time.Time     `json:"createdAt"`
	UpdatedAt  time.Time     `json:"updatedAt"`
	FinishedAt *time.Time    `json:"finishedAt,omitempty"`
}

// RolloutWave is one wave of a rollout.
type RolloutWave struct {
	Number     int        `json:"number"`
	State      string     `json:"state"`
	Nodes      []string   `json:"nodes"` // names
	StartedAt  time.Time  `json:"startedAt"`
	Deadline   time.Time  `json:"deadline"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// RolloutNode is one node's progress in a rollout.
type RolloutNode struct {
	NodeID string `json:"nodeId"`
	Name   string `json:"name"`
	Wave   int    `json:"wave,omitempty"`
	State  string `json:"state"`
	// PreviousVersion is the release it ran before (what a rollback sends it back to); Version
	// is what its bcd reports now.
	PreviousVersion string `json:"previousVersion,omitempty"`
	Version         string `json:"version,omitempty"`
	Online          bool   `json:"online"`
	Attempts        int    `json:"attempts"`
}
