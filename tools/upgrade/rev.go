package main

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// release is the revision whose binary plays the previous release, and
// the rule that chose it, as the report prints it.
type release struct {
	Rev  string // a full commit hash
	Rule string
}

// errNoHistory marks a checkout whose history cannot say which revision is
// the previous release: a shallow clone, or no git repository at all.
// Outside CI the check skips with the message; on CI it fails.
var errNoHistory = errors.New("no history to find the previous release in")

// migrationsGlob is the pathspec of the files that change the schema: the
// up migrations (a down file changes nothing a running binary sees).
const migrationsGlob = "db/migrations/*.up.sql"

// previousRelease chooses the revision whose binary must run against the
// work tree's schema, in this order:
//
//  1. from, when set (UPGRADE_FROM or -from): any revision git knows;
//  2. the newest tag v* that is an ancestor of HEAD, HEAD's own tags
//     excepted (git describe): the release the work tree would replace;
//  3. with no such tag, HEAD itself when the work tree adds, changes or
//     deletes an up migration that HEAD does not have: the old code is the
//     commit under the uncommitted schema change;
//  4. otherwise the parent of the newest commit that added or changed an
//     up migration: the code just before the last schema change, run
//     against the schema one change ahead, so every schema change meets
//     the code that preceded it at least once before it is released.
//
// A tag made on a branch HEAD never merged is not an ancestor and is not
// seen: name it with UPGRADE_FROM.
func previousRelease(root, from string) (release, error) {
	if _, err := git(root, "rev-parse", "--git-dir"); err != nil {
		return release{}, fmt.Errorf("%w: %s is not a git checkout (%w)", errNoHistory, root, err)
	}
	if from != "" {
		rev, err := git(root, "rev-parse", "--verify", "--quiet", from+"^{commit}")
		if err != nil {
			return release{}, fmt.Errorf("UPGRADE_FROM=%s names no commit of this repository (git rev-parse: %w); on a shallow clone fetch it first (git fetch --unshallow)", from, err)
		}
		return release{Rev: rev, Rule: "UPGRADE_FROM=" + from}, nil
	}
	if shallow, err := git(root, "rev-parse", "--is-shallow-repository"); err != nil {
		return release{}, err
	} else if shallow == "true" {
		return release{}, fmt.Errorf("%w: this clone is shallow, so the previous release may not be in it; run git fetch --unshallow (or clone with full history), or name the revision with UPGRADE_FROM", errNoHistory)
	}

	describe := []string{"describe", "--tags", "--abbrev=0", "--match", "v[0-9]*"}
	atHead, err := git(root, "tag", "--points-at", "HEAD", "--list", "v[0-9]*")
	if err != nil {
		return release{}, err
	}
	for _, tag := range strings.Fields(atHead) {
		describe = append(describe, "--exclude", tag)
	}
	if tag, err := git(root, append(describe, "HEAD")...); err == nil && tag != "" {
		rev, err := git(root, "rev-parse", "--verify", tag+"^{commit}")
		if err != nil {
			return release{}, err
		}
		return release{Rev: rev, Rule: "tag " + tag + ": the newest v* tag HEAD descends from"}, nil
	}

	status, err := git(root, "status", "--porcelain", "--untracked-files=all", "--", migrationsGlob)
	if err != nil {
		return release{}, err
	}
	if status != "" {
		head, err := git(root, "rev-parse", "--verify", "HEAD")
		if err != nil {
			return release{}, err
		}
		changed := strings.Fields(strings.ReplaceAll(status, "\n", " "))
		return release{Rev: head, Rule: "no v* tag; HEAD: the work tree changes an up migration HEAD lacks (git status: " + strings.Join(changed, " ") + ")"}, nil
	}

	last, err := git(root, "log", "-1", "--format=%H %s", "--", migrationsGlob)
	if err != nil {
		return release{}, err
	}
	if last == "" {
		return release{}, errors.New("no v* tag and no commit adds a migration under db/migrations: there is no previous schema to upgrade from; name a revision with UPGRADE_FROM")
	}
	commit, subject, _ := strings.Cut(last, " ")
	parent, err := git(root, "rev-parse", "--verify", "--quiet", commit+"^")
	if err != nil {
		return release{}, fmt.Errorf("no v* tag, and the newest commit changing a migration (%.12s) has no parent: there is no previous release; name one with UPGRADE_FROM", commit)
	}
	if len(subject) > 60 {
		subject = subject[:57] + "..."
	}
	return release{Rev: parent, Rule: fmt.Sprintf("no v* tag; the parent of %.12s, the newest commit changing an up migration (%q)", commit, subject)}, nil
}

// git runs git in dir and returns its standard output, trimmed.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// inCI reports whether CI is set to anything but a false value: there a
// check that cannot run fails instead of skipping.
func inCI(getenv func(string) string) bool {
	switch strings.ToLower(getenv("CI")) {
	case "", "0", "false", "no":
		return false
	}
	return true
}
