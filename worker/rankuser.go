package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// rankUser is the account ranks run as (worker --rank-user): another uid
// than the agent's, so that what the agent keeps for itself (its node's
// key, its environment, other jobs' held checkpoints, its state) is not
// the ranks' to read.
type rankUser struct {
	name     string
	home     string
	uid, gid uint32
	groups   []uint32
}

// lookupRankUser resolves name (a user name or a numeric uid). The agent
// must run as root to start processes as another user.
func lookupRankUser(name string) (*rankUser, error) {
	if name == "" {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return nil, fmt.Errorf("--rank-user %q: no such user", name)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("--rank-user %q: %v", name, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("--rank-user %q: is root; give an unprivileged user", name)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("--rank-user %q: the agent must run as root to start ranks as another user", name)
	}
	r := &rankUser{name: u.Username, home: u.HomeDir, uid: uint32(uid), gid: uint32(gid)}
	gids, _ := u.GroupIds()
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			r.groups = append(r.groups, uint32(n))
		}
	}
	return r, nil
}

// credential is how a rank process is started as the user.
func (r *rankUser) credential() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: r.uid, Gid: r.gid, Groups: r.groups}}
}

// env is what a rank's environment says of its user, over the agent's.
func (r *rankUser) env() []string {
	return []string{"HOME=" + r.home, "USER=" + r.name, "LOGNAME=" + r.name}
}

// give makes path the user's (the path alone, not what it holds).
func (r *rankUser) give(path string) error { return os.Lchown(path, int(r.uid), int(r.gid)) }

// giveAll makes path and everything under it the user's.
func (r *rankUser) giveAll(path string) error {
	return filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return r.give(p)
	})
}

// closeHeld closes the held checkpoints of every job under root (the
// holder's) to all but the agent, but those of running (the job whose
// ranks are about to run here; "" for none): root can be passed through,
// not listed, a job's directory is the agent's alone (mode 0700), and
// running's own directory (own, its ranks' GPUCOORD_CHECKPOINT_DIR) is
// its ranks' user's, reached through its job's directory (0711). What
// other jobs' ranks wrote stays behind their job's closed directory.
func (r *rankUser) closeHeld(root string, jobs []string, running, own string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	errs := []error{os.Chmod(root, 0o711)}
	for _, job := range jobs {
		if job != running {
			errs = append(errs, os.Chmod(filepath.Join(root, job), 0o700))
		}
	}
	if running != "" {
		errs = append(errs, os.Chmod(filepath.Join(root, running), 0o711), r.giveAll(own))
	}
	return errors.Join(errs...)
}
