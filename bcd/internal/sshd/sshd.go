// Package sshd is bcd's SSH access converger: it gives the host's sshd what the control plane's
// desired state says (the part api.SSHAccessKind): the certificate authorities of the tenants
// whose reservations hold the node (TrustedUserCAKeys), the principals of those reservations,
// each for the reservation's own user and, for a holder of the whole node or a break-glass
// certificate, for the operator login as well (AuthorizedPrincipalsFile, one per user), and
// the revoked certificates (RevokedKeys, a KRL). sshd reads these files at every authentication, so nothing is restarted. The sshd
// configuration that points at them is written beside them (Config), for the host's sshd_config
// to Include.
package sshd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/lib/sshkrl"
)

// The files in the converger's directory.
const (
	CAKeysFile     = "trusted_user_ca_keys"
	PrincipalsDir  = "principals" // one file per login user: %u
	RevokedFile    = "revoked_keys.krl"
	ConfigSnippet  = "sshd_config"
	defaultUser    = "root"
	snippetPreface = "# Written by bcd: SSH access for the holders of this node's reservations. Include this file from sshd_config.\n"
)

// holderUsers is an sshd pattern of the holders' users (api.ReservationUser: "bc-" and 12 hex
// digits).
const holderUsers = "bc-????????????"

var userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// Converger keeps Dir's files as the desired state says.
type Converger struct {
	Dir string // e.g. /etc/ssh/better-compute
	// User is the node's operator login: a holder of the whole node and a break-glass
	// certificate log in as it (api.SSHAccess.Principals); default root.
	User string
	// Holders finds the user a reservation's certificates log in as (the holder's own, which
	// bcd makes: bcd/internal/tenancy). Nil, or a reservation it does not know: nobody logs in
	// for the holder, never as User.
	Holders func(reservation string) (user string, ok bool)
}

// New checks the directory and the user, and writes an sshd configuration snippet and files
// that let nobody in, so that an sshd including it starts before the first desired state.
// holders finds a holder's own user (Converger.Holders).
func New(dir, user string, holders func(reservation string) (string, bool)) (*Converger, error) {
	if user == "" {
		user = defaultUser
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("sshd: the directory %q must be absolute (sshd's configuration names it)", dir)
	}
	if !userRE.MatchString(user) {
		return nil, fmt.Errorf("sshd: %q is not a user name", user)
	}
	c := &Converger{Dir: dir, User: user, Holders: holders}
	// sshd reads a user's principals file as that user: the directory is walked through, not
	// listed.
	if err := os.MkdirAll(filepath.Join(dir, PrincipalsDir), 0o711); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	if err := os.Chmod(filepath.Join(dir, PrincipalsDir), 0o711); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	snippet := snippetPreface + fmt.Sprintf("TrustedUserCAKeys %s\nAuthorizedPrincipalsFile %s\nRevokedKeys %s\n",
		filepath.Join(dir, CAKeysFile), filepath.Join(dir, PrincipalsDir, "%u"), filepath.Join(dir, RevokedFile)) +
		// A holder's user logs in by certificate alone: a key it wrote into its own home's
		// authorized_keys would let it in past its certificates' revocation. (sshd ends a Match
		// at the end of the included file; the host's other users keep its settings.)
		"Match User " + holderUsers + "\n  AuthorizedKeysFile none\n  AuthorizedKeysCommand none\n"
	if err := write(filepath.Join(dir, ConfigSnippet), []byte(snippet)); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, RevokedFile)); errors.Is(err, os.ErrNotExist) {
		if err := c.apply(api.SSHAccess{}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Apply converges a push of the part (nil: no reservation holds the node; nobody gets in).
func (c *Converger) Apply(_ context.Context, version uint32, payload []byte) error {
	if payload == nil {
		return c.apply(api.SSHAccess{})
	}
	if version != api.SSHAccessVersion {
		return fmt.Errorf("%s version %d is not known to this bcd (it knows %d)", api.SSHAccessKind, version, api.SSHAccessVersion)
	}
	var a api.SSHAccess
	if err := json.Unmarshal(payload, &a); err != nil {
		return fmt.Errorf("%s: %w", api.SSHAccessKind, err)
	}
	return c.apply(a)
}

func (c *Converger) apply(a api.SSHAccess) error {
	for _, line := range append(append([]string{}, a.CAKeys...), a.Principals...) {
		if strings.ContainsAny(line, "\n\r") {
			return fmt.Errorf("sshd: a line of the SSH access spans lines: %.40q", line)
		}
	}
	krl := a.KRL
	if len(krl) == 0 {
		krl = sshkrl.Write(0, time.Unix(0, 0), nil) // sshd refuses every key when RevokedKeys is missing or unreadable
	}
	// Each user's principals: the operator login's, and each holder's own. sshd reads a user's
	// file as that user: a holder's is readable by its own group alone (the others' principals
	// name the other reservations on the node).
	principals := map[string][]string{c.User: a.Principals}
	groups := map[string]int{c.User: -1}
	for _, h := range a.Holders {
		for _, p := range h.Principals {
			if strings.ContainsAny(p, "\n\r") {
				return fmt.Errorf("sshd: a principal spans lines: %.40q", p)
			}
		}
		if c.Holders == nil {
			continue
		}
		name, ok := c.Holders(h.Reservation)
		if !ok || !userRE.MatchString(name) || name == c.User {
			continue
		}
		u, err := user.Lookup(name)
		if err != nil {
			continue // not made (yet): nobody logs in for it
		}
		gid, err := strconv.Atoi(u.Gid)
		if err != nil {
			continue
		}
		principals[name] = append(principals[name], h.Principals...)
		groups[name] = gid
	}
	// The revocations first and the principals last: a principal is never let in before its
	// certificates' revocations are in place.
	if err := write(filepath.Join(c.Dir, RevokedFile), krl); err != nil {
		return err
	}
	if err := write(filepath.Join(c.Dir, CAKeysFile), lines(a.CAKeys)); err != nil {
		return err
	}
	for name, ps := range principals {
		p := filepath.Join(c.Dir, PrincipalsDir, name)
		if groups[name] < 0 {
			if err := write(p, lines(ps)); err != nil {
				return err
			}
			continue
		}
		if err := writeFor(p, lines(ps), groups[name]); err != nil {
			return err
		}
	}
	// A user no longer let in: its file goes.
	entries, err := os.ReadDir(filepath.Join(c.Dir, PrincipalsDir))
	if err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	for _, e := range entries {
		if _, ok := principals[e.Name()]; !ok {
			if err := os.Remove(filepath.Join(c.Dir, PrincipalsDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("sshd: %w", err)
			}
		}
	}
	return nil
}

func lines(ls []string) []byte {
	if len(ls) == 0 {
		return nil
	}
	return []byte(strings.Join(ls, "\n") + "\n")
}

// write replaces a file atomically, readable by sshd (which runs as root, and checks nothing
// of these files' modes but that they are not writable by others).
func write(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	return nil
}

// writeFor replaces a file atomically, root's and readable by group gid alone (0640).
func writeFor(path string, b []byte, gid int) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	if err := os.Chown(tmp, 0, gid); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	if err := os.Chmod(tmp, 0o640); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	return nil
}
