package embedded

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A cluster template is what initdb made (and Options.Prepare, if set), kept once per machine
// (per user, PostgreSQL build, initdb settings and PrepareKey) and copied into each new
// cluster's data directory: a copy takes a fraction of initdb's time, which was most of a cold
// start (docs/benchmarks.md). Templates are immutable once made,
// so copies need no lock; a template is made in a temporary directory beside it and renamed
// into place, so processes that find none at once each make one, one rename wins, and no
// reader sees a half-made template.

// templateFormat changes when what a template holds changes, so that older ones are not used.
const templateFormat = "1"

// initdbArgs are initdb's settings for every cluster, past -D and the password file. WAL
// segments of 1 MiB rather than 16: a new cluster's one segment is most of what there is to copy
// (16 of 39 MiB), and a development or test cluster's WAL is small.
var initdbArgs = []string{"-U", Superuser, "-A", "scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync", "--wal-segsize=1"}

// defaultTemplateDir is where templates are kept when Options.TemplateDir is empty:
// $XDG_CACHE_HOME/better-compute/postgres (~/.cache/…, ~/Library/Caches/… on macOS), or ""
// when the user has no cache directory, and clusters are then made by initdb every time.
func defaultTemplateDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "better-compute", "postgres")
}

// templateKey names a template by everything that makes it: the format, the binaries (path,
// size and modification time, so an upgraded PostgreSQL gets a new one), initdb's settings and
// the account the server runs as; then, after a dash, what Prepare made, if anything.
func templateKey(bin string, a *account, prepareKey string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "format %s\nargs %s\n", templateFormat, strings.Join(initdbArgs, " "))
	if a != nil {
		fmt.Fprintf(h, "account %d:%d\n", a.uid, a.gid)
	}
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(bin, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %s %d %d\n", name, filepath.Join(bin, name), fi.Size(), fi.ModTime().UnixNano())
	}
	key := "pg-" + hex.EncodeToString(h.Sum(nil))[:24]
	if prepareKey != "" {
		p := sha256.Sum256([]byte(prepareKey))
		key += "-" + hex.EncodeToString(p[:])[:12]
	}
	return key, nil
}

// fromTemplate fills the cluster's empty data directory from the template, and answers whether
// it did. A template missing, or one that cannot be copied whole (removed meanwhile, a disk
// full), leaves the directory empty again for initdb: the template is a cache.
func (c *Cluster) fromTemplate(tpl string, a *account) bool {
	if !ours(tpl) {
		return false // not one this user made: left alone, and initdb makes the cluster
	}
	if _, err := os.Stat(filepath.Join(tpl, "PG_VERSION")); err != nil {
		return false
	}
	// The password is read from the copy: the template may be replaced meanwhile (discarded,
	// then made again by another process), and the files and their password must be one's.
	err := copyTree(tpl, c.dataDir, a)
	var pw string
	if err == nil {
		pw, err = readPassword(c.dataDir)
	}
	if err != nil {
		entries, _ := os.ReadDir(c.dataDir)
		for _, e := range entries {
			os.RemoveAll(filepath.Join(c.dataDir, e.Name()))
		}
		discard(tpl) // so that the cluster initdb makes next replaces it
		return false
	}
	c.password = pw
	now := time.Now()
	_ = os.Chtimes(tpl, now, now) // used: kept (keepTemplate)
	return true
}

// ours reports whether dir is a directory this user made and no one else may write to, as
// keepTemplate makes every template: a TemplateDir others can write to (one shared between
// users) may hold a template planted there, whose roles and data would be in every copy.
func ours(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == uint32(os.Geteuid())
}

// keepTemplate copies the cluster initdb made (and prepared), before its server starts for its
// caller, into the cache as the template tpl. A failure only means the next cluster runs initdb
// too.
func (c *Cluster) keepTemplate(tpl string) error {
	parent := filepath.Dir(tpl)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	// What a process that died while making or discarding a template left.
	left, _ := filepath.Glob(filepath.Join(parent, ".*-*"))
	for _, l := range left {
		if fi, err := os.Stat(l); err == nil && time.Since(fi.ModTime()) > time.Hour {
			_ = removeAll(l)
		}
	}
	tmp, err := os.MkdirTemp(parent, ".making-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // gone once renamed; what is left when another process won
	if err := copyTree(c.dataDir, tmp, nil); err != nil {
		return err
	}
	if err := os.Rename(tmp, tpl); err != nil {
		if _, serr := os.Stat(filepath.Join(tpl, "PG_VERSION")); serr == nil {
			return nil // another process kept one first
		}
		return err
	}
	// Prepared templates of the same binaries and settings that no start has used for a while
	// (older migrations) go: a start copying one of them meanwhile falls back to initdb.
	if i := strings.LastIndex(filepath.Base(tpl), "-"); i > len("pg-") {
		siblings, _ := filepath.Glob(filepath.Join(parent, filepath.Base(tpl)[:i+1]+"*"))
		for _, s := range siblings {
			if fi, err := os.Stat(s); err == nil && s != tpl && time.Since(fi.ModTime()) > templateUnused {
				discard(s)
			}
		}
	}
	return nil
}

// discard removes the template dir, renaming it out of its name first: removed in place, a start
// copying it meanwhile could copy a tree missing what was already gone, and a process that died
// removing it would leave half a template that every later start copies.
func discard(dir string) {
	gone, err := os.MkdirTemp(filepath.Dir(dir), ".gone-")
	if err != nil {
		return
	}
	if err := os.Rename(dir, filepath.Join(gone, "template")); err != nil {
		_ = os.Remove(gone)
		return
	}
	_ = removeAll(gone) // what is left, if this process dies, goes with the next keepTemplate
}

// removeAll is os.RemoveAll; a test stops it partway, as a process dying would.
var removeAll = os.RemoveAll

// templateUnused is how long a prepared template is kept unused while another of its family is
// made: a day, so that the variants in use (a devserver with modules, tests without) stay.
const templateUnused = 24 * time.Hour

// copyTree copies the directories and regular files under src into dst (which may exist),
// keeping their permission bits, and gives them to a when it is not nil. A data directory holds
// nothing else; anything else is an error rather than a cluster missing a part.
func copyTree(src, dst string, a *account) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil && !(rel == "." && errors.Is(err, fs.ErrExist)) {
				return err
			}
		case info.Mode().IsRegular():
			if err := copyFile(path, to, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is not a file or a directory", path)
		}
		if a != nil {
			return os.Chown(to, int(a.uid), int(a.gid))
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in) // copy_file_range where the file system has it
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
