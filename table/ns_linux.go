//go:build linux

package table

import (
	"os"

	"golang.org/x/sys/unix"
)

// selfNS is this process's PID and network namespaces (inode numbers of
// the nsfs files; 0 where they cannot be read): from /proc/self/ns, or,
// without /proc, from the kernel directly (a socket's network namespace,
// SIOCGSKNS; a pidfd's PID namespace, PIDFD_GET_PID_NAMESPACE).
var selfNS = readSelfNS()

type namespaces struct{ pid, net uint64 }

const (
	siocgskns            = 0x894C
	pidfdGetPidNamespace = 0xFF05 // _IO(PIDFS_IOCTL_MAGIC, 5), Linux 6.11
)

func readSelfNS() namespaces {
	var ns namespaces
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) == nil {
		ns.pid = st.Ino
	} else if pfd, err := unix.PidfdOpen(os.Getpid(), 0); err == nil {
		if nfd, err := unix.IoctlRetInt(pfd, pidfdGetPidNamespace); err == nil {
			if unix.Fstat(nfd, &st) == nil {
				ns.pid = st.Ino
			}
			unix.Close(nfd)
		}
		unix.Close(pfd)
	}
	if unix.Stat("/proc/self/ns/net", &st) == nil {
		ns.net = st.Ino
	} else if sfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		if nfd, err := unix.IoctlRetInt(sfd, siocgskns); err == nil {
			if unix.Fstat(nfd, &st) == nil {
				ns.net = st.Ino
			}
			unix.Close(nfd)
		}
		unix.Close(sfd)
	}
	return ns
}
