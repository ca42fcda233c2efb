//go:build linux

package stress

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProcessAlive: a running process is alive; one whose exit has begun,
// a zombie (exited, not yet waited for), a process that is gone, and a
// reused pid (another start time) are not.
func TestProcessAlive(t *testing.T) {
	self := os.Getpid()
	require.True(t, processAlive(self, processStart(self)))
	require.True(t, processAlive(self, 0))
	require.False(t, processAlive(self, processStart(self)+1), "another start time: a reused pid")
	require.False(t, processAlive(0, 0))

	cmd := exec.Command("/bin/sh", "-c", "exit 0")
	if err := cmd.Start(); err != nil {
		t.Skip("no /bin/sh: ", err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid, 0) {
		require.True(t, time.Now().Before(deadline), "the exited child never showed as a zombie")
		time.Sleep(time.Millisecond)
	}
	// Not alive as soon as its exit begins; a zombie (still in /proc: not
	// yet waited for) once it has ended.
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		require.NoError(t, err, "not yet waited for: still in /proc")
		st, _, ok := parseStat(b)
		require.True(t, ok)
		if st == 'Z' {
			break
		}
		require.True(t, time.Now().Before(deadline), "the exited child never became a zombie (state %c)", st)
		require.False(t, processAlive(pid, 0), "an exiting process is not alive")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, cmd.Wait())
	require.False(t, processAlive(pid, 0))
}
