package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/theupdateframework/go-tuf/v2/metadata"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// The offline half of the release repository (docs/releases.md): the root and targets keys are
// files in a directory of the signer's machine, never sent anywhere. init makes them and signs a
// root; sign lists builds in a new targets version signed with the targets key; both publish
// through the API when the control plane is reachable, or write files to carry over.

const (
	rootKeyFile    = "root.key"
	targetsKeyFile = "targets.key"
	rootFile       = "root.json"
)

// keyIn reads the key file name of dir, or makes it when make is set and there is none.
func keyIn(dir, name string, create bool) (ed25519.PrivateKey, error) {
	path := filepath.Join(dir, name)
	k, err := tufrepo.ReadKeyFile(path)
	if err == nil || !create || !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	if _, k, err = ed25519.GenerateKey(nil); err != nil {
		return nil, err
	}
	return k, tufrepo.WriteKeyFile(path, k)
}

func releasesInitCmd(p *profile) *cobra.Command {
	var keys, onlineKeys, previousRootKey, out string
	var expires time.Duration
	var version int64
	c := &cobra.Command{
		Use:   "init --keys DIR",
		Short: "Make the offline root and targets keys (if DIR has none) and sign and install the repository's root",
		Long: `init keeps the root and targets keys in DIR (root.key and targets.key, Ed25519, mode 0600; made when
missing) and signs a root that delegates targets to the targets key and snapshot and timestamp to the
control plane's online keys (releases.keys, or --online-keys FILE with that answer). The root is the
next version of the control plane's (1 for the first); a new root key is used with
--previous-root-key, the current root's key, which signs it too. The root is written to DIR/root.json
(give it to nodes: bcd node --release-root) and installed with releases.setRoot, unless --out names
a file to write it to instead (for a signer that does not reach the control plane).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keys == "" {
				return usageError{Err: errors.New("init needs --keys DIR, where the offline keys are kept")}
			}
			if err := os.MkdirAll(keys, 0o700); err != nil {
				return err
			}
			rootKey, err := keyIn(keys, rootKeyFile, true)
			if err != nil {
				return err
			}
			targetsKey, err := keyIn(keys, targetsKeyFile, true)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			var cl *client.Client
			if out == "" || onlineKeys == "" {
				if cl, err = serverClient(p); err != nil {
					return err
				}
			}
			var online api.ReleaseKeys
			if onlineKeys != "" {
				b, err := os.ReadFile(onlineKeys)
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &online); err != nil {
					return fmt.Errorf("--online-keys %s: %w", onlineKeys, err)
				}
			} else if online, err = cl.Releases.Keys(ctx, api.GetReleaseKeys{}); err != nil {
				return err
			}
			snap, err := tufrepo.ParsePublicKey(online.Snapshot.Public)
			if err != nil {
				return err
			}
			ts, err := tufrepo.ParsePublicKey(online.Timestamp.Public)
			if err != nil {
				return err
			}
			if version == 0 {
				version = 1
				if cl != nil {
					cur, err := cl.Releases.Metadata(ctx, api.GetReleaseMetadata{Role: api.RoleRoot})
					if err == nil {
						version = cur.Version + 1
					} else if api.CodeOf(err) != api.CodeNotFound {
						return err
					}
				}
			}
			signers := []ed25519.PrivateKey{rootKey}
			if previousRootKey != "" {
				prev, err := tufrepo.ReadKeyFile(previousRootKey)
				if err != nil {
					return err
				}
				signers = append(signers, prev)
			}
			root, err := tufrepo.SignRoot(version, tufrepo.RootKeys{Root: []ed25519.PublicKey{pub(rootKey)}, Targets: []ed25519.PublicKey{pub(targetsKey)},
				Snapshot: snap, Timestamp: ts}, time.Now().Add(expires), signers...)
			if err != nil {
				return err
			}
			dst := out
			if dst == "" {
				dst = filepath.Join(keys, rootFile)
			}
			if err := os.WriteFile(dst, root, 0o644); err != nil {
				return err
			}
			if out != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "root %d written to %s; install it with: better-compute releases set-root --json '{\"root\": …}'\n", version, out)
				return nil
			}
			md, err := cl.Releases.SetRoot(ctx, api.SetReleaseRoot{Root: root})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "root %d installed, until %s; kept in %s (bcd node --release-root pins it)\nkeys: %s (root), %s (targets): keep them off the control plane\n",
				md.Version, md.ExpiresAt.Format(time.RFC3339), dst, filepath.Join(keys, rootKeyFile), filepath.Join(keys, targetsKeyFile))
			return nil
		},
	}
	c.Flags().StringVar(&keys, "keys", "", "the directory of the offline keys")
	c.Flags().StringVar(&onlineKeys, "online-keys", "", "the control plane's online keys (releases.keys's answer, as JSON), instead of asking it")
	c.Flags().StringVar(&previousRootKey, "previous-root-key", "", "the current root's key, to rotate the root key: it signs the new root too")
	c.Flags().StringVar(&out, "out", "", "write the signed root here instead of installing it")
	c.Flags().Int64Var(&version, "version", 0, "the root's version (default: the control plane's current one plus 1)")
	c.Flags().DurationVar(&expires, "expires", tufrepo.DefaultRootLifetime, "how long the root is valid")
	return c
}

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// buildFlag is one --file os/arch=PATH.
type buildFlag struct {
	os, arch, path string
}

func parseBuilds(vals []string) ([]buildFlag, error) {
	var out []buildFlag
	for _, v := range vals {
		platform, path, ok := strings.Cut(v, "=")
		goos, arch, ok2 := strings.Cut(platform, "/")
		if !ok || !ok2 || path == "" {
			return nil, usageError{Err: fmt.Errorf("--file %q: want os/arch=PATH, e.g. linux/amd64=./bcd", v)}
		}
		out = append(out, buildFlag{os: goos, arch: arch, path: path})
	}
	if len(out) == 0 {
		return nil, usageError{Err: errors.New("name at least one build: --file linux/amd64=./bcd")}
	}
	return out, nil
}

func releasesSignCmd(p *profile) *cobra.Command {
	var keys, version, current, out string
	var files []string
	var expires time.Duration
	c := &cobra.Command{
		Use:   "sign --keys DIR --version V --file os/arch=PATH...",
		Short: "List builds of a release in the next targets metadata, signed with the offline targets key, and publish it",
		Long: `sign reads the targets key in DIR, adds each build (its length and SHA-256, computed here from the file,
and its version and platform) to the successor of the repository's current targets metadata
(releases.metadata, or --current FILE) and signs it. It then uploads the builds and publishes the
targets (releases.upload, releases.publish), unless --out names a file to write the signed targets
to instead: carry it and the builds to a machine that reaches the control plane and run
better-compute releases push there. Build bcd with -ldflags "-X github.com/better-compute/compute/bcd/app.version=V":
a rollout waits for nodes to report V.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keys == "" || version == "" {
				return usageError{Err: errors.New("sign needs --keys DIR and --version V")}
			}
			if err := api.ValidateReleaseVersion("version", version); err != nil {
				return usageError{Err: err}
			}
			builds, err := parseBuilds(files)
			if err != nil {
				return err
			}
			key, err := keyIn(keys, targetsKeyFile, false)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			var cl *client.Client
			if out == "" || current == "" {
				if cl, err = serverClient(p); err != nil {
					return err
				}
			}
			var prev []byte
			if current != "" {
				if prev, err = os.ReadFile(current); err != nil {
					return err
				}
			} else {
				md, err := cl.Releases.Metadata(ctx, api.GetReleaseMetadata{Role: api.RoleTargets})
				if err == nil {
					prev = md.Metadata
				} else if api.CodeOf(err) != api.CodeNotFound {
					return err
				}
			}
			var bf []tufrepo.BuildFile
			for _, b := range builds {
				f, err := os.Open(b.path)
				if err != nil {
					return err
				}
				defer f.Close()
				bf = append(bf, tufrepo.BuildFile{Build: tufrepo.Build{Version: version, OS: b.os, Arch: b.arch}, Bytes: f})
			}
			signed, err := tufrepo.SignTargets(prev, bf, key, time.Now().Add(expires))
			if err != nil {
				return err
			}
			if out != "" {
				if err := os.WriteFile(out, signed, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "targets signed into %s; publish them with: better-compute releases push --signed %s --file …\n", out, out)
				return nil
			}
			return push(ctx, cmd.OutOrStdout(), p, cl, signed, builds)
		},
	}
	c.Flags().StringVar(&keys, "keys", "", "the directory of the offline keys (targets.key)")
	c.Flags().StringVar(&version, "version", "", "the release's version, as the builds report it (bcd version)")
	c.Flags().StringArrayVar(&files, "file", nil, "a build: os/arch=PATH, e.g. linux/amd64=./bcd; repeatable")
	c.Flags().StringVar(&current, "current", "", "the repository's current targets metadata, as a file (default: asked of the control plane)")
	c.Flags().StringVar(&out, "out", "", "write the signed targets here instead of publishing them")
	c.Flags().DurationVar(&expires, "expires", tufrepo.DefaultTargetsLifetime, "how long the targets metadata is valid (sign a new version before then)")
	return c
}

func releasesPushCmd(p *profile) *cobra.Command {
	var signed string
	var files []string
	c := &cobra.Command{
		Use:   "push --signed FILE --file os/arch=PATH...",
		Short: "Upload builds and publish targets metadata signed elsewhere (releases sign --out)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if signed == "" {
				return usageError{Err: errors.New("push needs --signed FILE")}
			}
			builds, err := parseBuilds(files)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(signed)
			if err != nil {
				return err
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			return push(ctx, cmd.OutOrStdout(), p, cl, b, builds)
		},
	}
	c.Flags().StringVar(&signed, "signed", "", "the signed targets metadata")
	c.Flags().StringArrayVar(&files, "file", nil, "a build the targets list: os/arch=PATH; repeatable")
	return c
}

// push uploads each build the signed targets list for its platform, checked against what they
// say of it, and publishes the targets.
func push(ctx context.Context, w io.Writer, p *profile, cl *client.Client, signed []byte, builds []buildFlag) error {
	t, err := metadata.Targets().FromBytes(signed)
	if err != nil {
		return fmt.Errorf("the signed targets: %w", err)
	}
	for _, b := range builds {
		data, err := os.ReadFile(b.path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		var listed *tufrepo.Build
		for name, tf := range t.Signed.Targets {
			got, err := tufrepo.BuildOf(name, tf)
			if err == nil && got.OS == b.os && got.Arch == b.arch {
				if s, _ := tufrepo.SHA256(tf); s == hex.EncodeToString(sum[:]) && tf.Length == int64(len(data)) {
					listed = &got
				}
			}
		}
		if listed == nil {
			return fmt.Errorf("%s (%s/%s) is not a build the signed targets list", b.path, b.os, b.arch)
		}
		tk, err := cl.Releases.Upload(ctx, api.UploadBuild{Version: listed.Version, OS: b.os, Arch: b.arch, Length: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
		if err != nil {
			return err
		}
		if !tk.Held {
			if err := putBuild(ctx, strings.TrimSuffix(p.URL, "/")+tk.URL, data); err != nil {
				return fmt.Errorf("upload %s: %w", b.path, err)
			}
		}
		fmt.Fprintf(w, "uploaded %s %s/%s (%d bytes)\n", listed.Version, b.os, b.arch, len(data))
	}
	res, err := cl.Releases.Publish(ctx, api.PublishTargets{Targets: signed})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "published targets %d (snapshot %d, timestamp %d)", res.Targets, res.Snapshot, res.Timestamp)
	for _, r := range res.Added {
		fmt.Fprintf(w, "; release %s", r.Version)
	}
	fmt.Fprintln(w)
	return nil
}

func putBuild(ctx context.Context, url string, data []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var body api.ErrorBody
		if json.NewDecoder(res.Body).Decode(&body) == nil && body.Error != nil {
			return body.Error
		}
		return errors.New(res.Status)
	}
	return nil
}

// rolloutsWatchCmd follows a rollout until it stops: better-compute rollouts watch --rollout ID.
func rolloutsWatchCmd(p *profile) *cobra.Command {
	var id string
	var every time.Duration
	c := &cobra.Command{
		Use:   "watch [rollout]",
		Short: "Follow a rollout's waves until it succeeds, pauses or is rolled back, with a progress bar",
		Long: "Prints a line each time the rollout's progress changes: a bar of its nodes on the release, the wave, " +
			"its state and what it waits for. Exits 0 when the rollout succeeds (or a rollback completes), 1 when it " +
			"pauses or fails (-o json: the rollout as JSON, each time it changes).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 { // as rollouts get takes it
				if id != "" && id != args[0] {
					return usageError{Err: fmt.Errorf("the rollout is %s or %s (--rollout): give one", args[0], id)}
				}
				id = args[0]
			}
			if err := (api.RolloutRef{Rollout: id}).Validate(); err != nil {
				return usageError{Err: fmt.Errorf("--rollout: %w", err)}
			}
			if every <= 0 {
				return usageError{Err: fmt.Errorf("--every %s: must be positive", every)}
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			last := ""
			for {
				r, err := cl.Rollouts.Get(ctx, api.RolloutRef{Rollout: id})
				if err != nil {
					return err
				}
				if line := rolloutLine(r); line != last {
					last = line
					if structured(p.Output) {
						if err := writeStream(cmd.OutOrStdout(), p.Output, r); err != nil {
							return err
						}
					} else {
						fmt.Fprintln(cmd.OutOrStdout(), clean(line))
					}
				}
				switch r.State {
				case api.RolloutSucceeded, api.RolloutRolledBack:
					return nil
				case api.RolloutPaused, api.RolloutFailed:
					return fmt.Errorf("rollout %s %s: %s", r.ID, r.State, r.Error)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	c.Flags().StringVar(&id, "rollout", "", "the rollout's id (rollouts create answers it)")
	c.Flags().DurationVar(&every, "every", time.Second, "how often to look")
	return c
}

// rolloutLine is a rollout's progress in one line:
//
//	[##----] 2/6 on v1.4.0, wave 2 running: wave 2: waiting for n3 to come back online on v1.4.0, until …
func rolloutLine(r api.Rollout) string {
	line := fmt.Sprintf("[%s%s] %d/%d on %s, wave %d %s", strings.Repeat("#", r.Updated), strings.Repeat("-", max(r.Total-r.Updated, 0)),
		r.Updated, r.Total, r.Release, r.Wave, r.State)
	if r.Error != "" {
		line += ": " + r.Error
	} else if r.Note != "" {
		line += ": " + r.Note
	}
	return line
}
