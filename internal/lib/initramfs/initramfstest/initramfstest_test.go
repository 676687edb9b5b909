package initramfstest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// childEnv makes the test binary a process that makes one cached file (TestOneMakerAcrossProcesses).
const childEnv = "INITRAMFSTEST_CHILD"

func TestMain(m *testing.M) {
	if calls := os.Getenv(childEnv); calls != "" {
		os.Exit(child(calls))
	}
	os.Exit(m.Run())
}

// child asks for the file "shared" of key "k", recording in calls that it made it, if it did.
func child(calls string) int {
	p, err := cached(os.Getenv(DirEnv), "shared", "k", func(path string) error {
		f, err := os.OpenFile(calls, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintln(f, os.Getpid())
		if err := f.Close(); err != nil {
			return err
		}
		return os.WriteFile(path, []byte("made once"), 0o644)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "made once" {
		fmt.Fprintf(os.Stderr, "read %s: %q, %v\n", p, b, err)
		return 1
	}
	return 0
}

// TestOneMakerAcrossProcesses: test binaries that ask for the same file at once (packages run
// side by side) make it once between them, and each reads it whole.
func TestOneMakerAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 4 {
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), childEnv+"="+calls, DirEnv+"="+dir)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, outs[i])
		}
	}
	b, _ := os.ReadFile(calls)
	if n := strings.Count(string(b), "\n"); n != 1 {
		t.Errorf("the file was made %d times, want once: %q", n, b)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestOneMakerInAProcess: tests of one binary asking at once make the file once; a failed make
// leaves nothing, and the next key is made anew.
func TestOneMakerInAProcess(t *testing.T) {
	t.Setenv(DirEnv, t.TempDir())
	var n atomic.Int32
	var wg sync.WaitGroup
	paths := make([]string, 8)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i] = File(t, "inproc", Key("a"), func(path string) error {
				n.Add(1)
				return os.WriteFile(path, []byte("x"), 0o644)
			})
		}()
	}
	wg.Wait()
	if n.Load() != 1 {
		t.Errorf("made %d times, want once", n.Load())
	}
	for _, p := range paths {
		if p != paths[0] {
			t.Fatalf("paths differ: %v", paths)
		}
	}

	err := makeFile(filepath.Join(Dir(t), "broken-"+Key("b")), func(path string) error {
		if err := os.WriteFile(path, []byte("half"), 0o644); err != nil {
			return err
		}
		return errors.New("the build failed")
	})
	if err == nil || !strings.Contains(err.Error(), "the build failed") {
		t.Fatalf("a failed make: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(Dir(t), "broken-*")); len(left) != 1 || !strings.HasSuffix(left[0], ".lock") {
		t.Errorf("after a failed make the directory holds %v, want only its lock", left)
	}
}

// TestOldVersionsGo: a new version of a file removes the versions of it unused for an hour, and
// any file unused for a day; files used since, and other files, stay.
func TestOldVersionsGo(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(DirEnv, dir)
	old := func(name string, unused time.Duration) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-unused)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	old("bcd-"+Key("1"), 2*time.Hour)
	old("bcd-"+Key("1")+".lock", 2*time.Hour)
	old("bcd-"+Key("2"), time.Minute)                     // used a minute ago: another worktree's
	old("bcd.test-"+Key("3"), 2*time.Hour)                // another file's version
	old("ramdisk-6.1.0-57-amd64-"+Key("4"), 25*time.Hour) // unused for a day
	File(t, "bcd", Key("5"), func(path string) error { return os.WriteFile(path, []byte("new"), 0o644) })
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"bcd-" + Key("2"), "bcd-" + Key("5"), "bcd-" + Key("5") + ".lock", "bcd.test-" + Key("3")}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Errorf("the cache holds %v, want %v", left, want)
	}
}

// TestKeysDoNotCollide: the parts are length-prefixed, so moving a boundary is another key.
func TestKeysDoNotCollide(t *testing.T) {
	if Key("ab", "c") == Key("a", "bc") || Key("a") == Key("a", "") || Key() == Key("") {
		t.Error("two lists of parts gave one key")
	}
	if a, b := []string{"a", "b"}, []string{"a", "b"}; Key(a...) != Key(b...) {
		t.Error("one list gave two keys")
	}
}

// TestBuildFollowsTheSource: a program is built once for its source, statically, and built
// again when a file of it changes.
func TestBuildFollowsTheSource(t *testing.T) {
	t.Setenv(DirEnv, t.TempDir())
	mod := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(mod, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/hello\n\ngo 1.22\n")
	write("main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"one\") }\n")
	g := Go{Package: "example.com/hello", Dir: mod}
	run := func(bin string) string {
		t.Helper()
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	first := Build(t, g)
	if got := run(first); got != "one" {
		t.Fatalf("the program says %q", got)
	}
	if again := Build(t, g); again != first {
		t.Errorf("the same source gave %s, then %s", first, again)
	}
	write("main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"two\") }\n")
	forgetKeys() // a test binary keeps the keys it found: the source is taken not to change under it
	second := Build(t, g)
	if second == first || run(second) != "two" {
		t.Errorf("after a change: %s says %q; want a new binary saying two", second, run(second))
	}
	if b, _ := os.ReadFile(second); bytes.Contains(b, []byte("/lib64/ld-linux")) {
		t.Error("the binary is dynamically linked")
	}

	// A test binary: its generated main is named by its path in the build cache.
	write("main_test.go", "package main\n\nimport \"testing\"\n\nfunc TestSays(t *testing.T) { t.Log(\"three\") }\n")
	tg := g
	tg.Test = true
	tbin := Build(t, tg)
	if out, err := exec.Command(tbin, "-test.v", "-test.run", "TestSays").CombinedOutput(); err != nil || !strings.Contains(string(out), "three") {
		t.Errorf("the test binary: %v\n%s", err, out)
	}
	write("main_test.go", "package main\n\nimport \"testing\"\n\nfunc TestSays(t *testing.T) { t.Log(\"four\") }\n")
	forgetKeys()
	if again := Build(t, tg); again == tbin {
		t.Error("a changed test file gave the same test binary")
	}
}

func forgetKeys() {
	keys.Lock()
	defer keys.Unlock()
	keys.m = nil
}
