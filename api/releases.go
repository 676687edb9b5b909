package api

import (
	"encoding/json"
	"regexp"
	"time"
)

// ResourceRelease is the IAM resource type of bcd's release repository: its TUF metadata and
// the builds it lists.
const ResourceRelease = "compute-release"

// The releases group: bcd's signed release repository (The Update Framework; docs/releases.md).
// The root and targets keys sign offline; the control plane signs snapshots and timestamps with
// its online keys and serves the repository to nodes over their mutual TLS.
var (
	ReleasesKeys     = NewMethod[GetReleaseKeys, ReleaseKeys]("releases", "keys", false, ResourceRelease, "v0.4", "The control plane's online keys, to which a release root delegates snapshot and timestamp.")
	ReleasesSetRoot  = NewMethod[SetReleaseRoot, ReleaseMetadata]("releases", "setRoot", true, ResourceRelease, "v0.4", "Install the repository's root metadata, signed offline: the first, or a rotation signed by the current root's keys too.")
	ReleasesUpload   = NewMethod[UploadBuild, UploadTicket]("releases", "upload", true, ResourceRelease, "v0.4", "A ticket to upload one bcd build (PUT its bytes to the ticket's URL); a build already held needs none.")
	ReleasesPublish  = NewMethod[PublishTargets, Published]("releases", "publish", true, ResourceRelease, "v0.4", "Publish targets metadata signed offline by the targets key; the control plane signs a snapshot and a timestamp over it.")
	ReleasesGet      = NewMethod[GetRelease, Release]("releases", "get", false, ResourceRelease, "v0.4", "Get a release: its builds by platform, with their lengths and hashes.")
	ReleasesList     = NewMethod[ListReleases, Page[Release]]("releases", "list", false, ResourceRelease, "v0.4", "List the published releases, newest first.")
	ReleasesMetadata = NewMethod[GetReleaseMetadata, ReleaseMetadata]("releases", "metadata", false, ResourceRelease, "v0.4", "The repository's current signed metadata of a role (root, targets, snapshot or timestamp).")
)

// ReleaseMethods returns the releases group.
func ReleaseMethods() []MethodInfo { return infos(releaseTable()) }

func releaseTable() []Describer {
	return []Describer{ReleasesKeys, ReleasesSetRoot, ReleasesUpload, ReleasesPublish, ReleasesGet, ReleasesList, ReleasesMetadata}
}

// Limits of the release repository.
const (
	MaxReleaseMetadataBytes = 4 << 20
	MaxBuildBytes           = 1 << 30
	// ReleaseUploadPath is where a ticket uploads a build: PUT BasePath+ReleaseUploadPath?ticket=….
	ReleaseUploadPath = "/releases/builds"
	// UploadTicketTTL is how long an upload ticket may wait to be used.
	UploadTicketTTL = 30 * time.Minute
)

// The roles of the repository's metadata.
const (
	RoleRoot      = "root"
	RoleTargets   = "targets"
	RoleSnapshot  = "snapshot"
	RoleTimestamp = "timestamp"
)

var (
	releaseVersionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	platformRE       = regexp.MustCompile(`^[a-z0-9]{1,16}$`)
	sha256RE         = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidateReleaseVersion checks a release's version: letters, digits and "._-", 64 characters at
// most, starting with a letter or digit; what bcd built with that version reports.
func ValidateReleaseVersion(field, v string) error {
	if v == "" {
		return InvalidField(field, "is required: a release's version, e.g. v1.4.0")
	}
	if !releaseVersionRE.MatchString(v) {
		return InvalidField(field, "%q is not a release version: use letters, digits and '._-', 64 characters at most, starting with a letter or digit", v)
	}
	return nil
}

// GetReleaseKeys is the input of releases.keys.
type GetReleaseKeys struct{}

// ReleaseKeys are the control plane's online keys, Ed25519, derived from its secret.
type ReleaseKeys struct {
	Snapshot  ReleaseKey `json:"snapshot"`
	Timestamp ReleaseKey `json:"timestamp"`
}

// ReleaseKey is a public key as TUF names it.
type ReleaseKey struct {
	KeyID  string `json:"keyId"`
	Type   string `json:"type"`   // ed25519
	Public string `json:"public"` // hex
}

// SetReleaseRoot is the input of releases.setRoot: root metadata, as the signer wrote it.
type SetReleaseRoot struct {
	Root json.RawMessage `json:"root"`
}

// Validate implements the input check of releases.setRoot.
func (in SetReleaseRoot) Validate() error { return validateMetadata("root", in.Root) }

func validateMetadata(field string, b json.RawMessage) error {
	if len(b) == 0 {
		return InvalidField(field, "is required: signed TUF metadata, a JSON object")
	}
	if len(b) > MaxReleaseMetadataBytes {
		return InvalidField(field, "is %d bytes; the limit is %d", len(b), MaxReleaseMetadataBytes)
	}
	return nil
}

// ReleaseMetadata is one role's signed metadata in the repository.
type ReleaseMetadata struct {
	Role      string          `json:"role"`
	Version   int64           `json:"version"`
	ExpiresAt time.Time       `json:"expiresAt"`
	Metadata  json.RawMessage `json:"metadata"`
}

// UploadBuild is the input of releases.upload: the build a ticket may upload, as its signer
// will list it.
type UploadBuild struct {
	Version string `json:"version"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	Length  int64  `json:"length" input:"int8"`
	SHA256  string `json:"sha256"` // hex
}

// Validate implements the input check of releases.upload.
func (in UploadBuild) Validate() error {
	if err := ValidateReleaseVersion("version", in.Version); err != nil {
		return err
	}
	if !platformRE.MatchString(in.OS) {
		return InvalidField("os", "%q is not a GOOS such as linux", in.OS)
	}
	if !platformRE.MatchString(in.Arch) {
		return InvalidField("arch", "%q is not a GOARCH such as amd64", in.Arch)
	}
	if in.Length <= 0 || in.Length > MaxBuildBytes {
		return InvalidField("length", "must be between 1 and %d bytes, got %d", MaxBuildBytes, in.Length)
	}
	if !sha256RE.MatchString(in.SHA256) {
		return InvalidField("sha256", "%q is not a SHA-256 in lowercase hex", in.SHA256)
	}
	return nil
}

// UploadTicket answers releases.upload: PUT the build's bytes to URL (under the API's base)
// within UploadTicketTTL. Held is true when the control plane holds those bytes already: there
// is nothing to upload.
type UploadTicket struct {
	Held      bool       `json:"held"`
	Ticket    string     `json:"ticket,omitempty"`
	URL       string     `json:"url,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// PublishTargets is the input of releases.publish: targets metadata signed by the targets key,
// the successor of the repository's current targets (releases.metadata).
type PublishTargets struct {
	Targets json.RawMessage `json:"targets"`
}

// Validate implements the input check of releases.publish.
func (in PublishTargets) Validate() error { return validateMetadata("targets", in.Targets) }

// Published answers releases.publish: the versions of the metadata now served, and the
// releases the targets added.
type Published struct {
	Targets   int64     `json:"targets"`
	Snapshot  int64     `json:"snapshot"`
	Timestamp int64     `json:"timestamp"`
	Added     []Release `json:"added"`
}

// GetRelease is the input of releases.get.
type GetRelease struct {
	Version string `json:"version"`
}

// Validate implements the input check of releases.get.
func (in GetRelease) Validate() error { return ValidateReleaseVersion("version", in.Version) }

// ListReleases is the input of releases.list.
type ListReleases struct {
	PageRequest
}

// Validate implements the input check of releases.list.
func (in ListReleases) Validate() error { return in.PageRequest.Validate() }

// Release is a version of bcd the repository's targets list.
type Release struct {
	Version        string         `json:"version"`
	Builds         []ReleaseBuild `json:"builds"`
	TargetsVersion int64          `json:"targetsVersion"` // of the targets metadata that first listed it
	PublishedBy    string         `json:"publishedBy"`
	PublishedAt    time.Time      `json:"publishedAt"`
}

// ReleaseBuild is one platform's build of a release: a target of the repository.
type ReleaseBuild struct {
	OS     string `json:"os"`
	Arch   string `json:"arch"`
	Target string `json:"target"`
	Length int64  `json:"length"`
	SHA256 string `json:"sha256"`
}

// GetReleaseMetadata is the input of releases.metadata.
type GetReleaseMetadata struct {
	Role string `json:"role"`
}

// Validate implements the input check of releases.metadata.
func (in GetReleaseMetadata) Validate() error {
	if in.Role == "" {
		return InvalidField("role", "is required: root, targets, snapshot or timestamp")
	}
	return ValidateEnum("role", in.Role, RoleRoot, RoleTargets, RoleSnapshot, RoleTimestamp)
}

// ForReplay is what an idempotent replay keeps: the answer without the ticket, which the first
// answer showed.
func (t UploadTicket) ForReplay() any {
	t.Ticket, t.URL = "", ""
	return t
}
