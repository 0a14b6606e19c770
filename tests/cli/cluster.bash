# cluster.bash: a small cluster of Linux "nodes" on this one machine, for the multi-node tests.
# Sourced after lib.bash; needs root.
#
#   cluster_up node1 node2     the head and these nodes; CLUSTER is their folder
#   on NODE CMD...             CMD (a program) on NODE or on the head, in this folder, with this
#                              environment
#   node_kill NODE [silent]    every process of NODE at once; "silent": its link goes down first
#   node_start NODE            (re)starts a node that was killed
#   node_procs NODE            "pid name" of each process still on NODE
#   node_has NODE NAME         true while a process called NAME runs on NODE
#   link_bytes NODE            "rx tx": bytes the head received from / sent to NODE so far
#   cluster_down               everything above gone (put it in the EXIT trap)
#
# A node is the set of namespaces of one process, its init (the unshare'd shell below):
#   net    its own interface eth0, address 10.213.I.2/24 and a default route to the head;
#   uts    its own host name: what hostname, gethostname() and MPI_Get_processor_name() report,
#          so MPI and mgtrain count it as a node of its own;
#   mount  its own /tmp and /dev/shm (as on separate machines: Open MPI's session folders and
#          shared-memory segments, and Slurm's PMIx folders, are per node) and an /etc/hosts
#          naming every node. The test folder, the build folder and the source tree, like a
#          shared home, are visible at the same paths everywhere, also where they are in /tmp;
#   pid    its own process tree, so killing its init kills every process of the node at once,
#          its orted and ranks included, as a node that goes down.
# The head (host name "head", 10.213.0.1) is the login node: mpirun, sbatch and slurmctld run
# there. It holds one end of each node's veth pair and routes between the nodes, like a switch
# (a plain router: veth pairs and IP forwarding are all it takes, no bridge module). The nodes'
# process trees are branches of the head's, so that the rsh agent (cluster-rsh) that mpirun
# starts there can enter them, and so that the head's init takes the whole cluster with it.
#
# Nothing here touches the machine's own interfaces, routes or files: each veth pair is created
# with its ends already inside the head's and the node's namespaces, every address exists only
# there, and no namespace is named under /run/netns. The cluster ends with the head's init, which
# happens in cluster_down, when the test's shell dies without running it (killed by a timeout: a
# watcher sees it within a second), and at the latest after CLUSTER_LIFETIME seconds.
: "${T:?source lib.bash first: everything here lives in its folder}"

CLUSTER_LIFETIME=${CLUSTER_LIFETIME:-900}
CLUSTER="" CLUSTER_NODES=() HEAD_PID="" CLUSTER_WATCHER=""
declare -A NODE_PID NODE_INDEX

# The init of a node (or the head), run by unshare inside its new namespaces: sets them up, says
# "ready", then sleeps for the cluster's lifetime, reaping the processes that end up its children
# (the init of a PID namespace adopts its orphans).
_cluster_init() {
    local name=$1 dir=$2 lifetime=$3 share=$4 path top bound=" "
    shift 4 # the rest: the paths every node must see (_cluster_shared)
    set -e
    hostname "$name"
    mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm
    mkdir -p "$dir/tmp"
    chmod 1777 "$dir/tmp"
    # The node's own /tmp hides the machine's, and with it whatever of the test lives in /tmp
    # (the test folder, a build folder such as /tmp/build, even the source tree): bind the top
    # entry of /tmp that holds each such path into the new /tmp first, so its path still works.
    for path in "$share" "$@"; do
        case "$path" in
        /tmp/?*)
            top=${path#/tmp/}
            top=${top%%/*}
            [[ $bound == *" $top "* ]] && continue
            bound+="$top "
            # (a node started again finds the mount points of its first start)
            if [ -d "/tmp/$top" ]; then mkdir -p "$dir/tmp/$top"; else : >>"$dir/tmp/$top"; fi
            mount --bind "/tmp/$top" "$dir/tmp/$top"
            ;;
        esac
    done
    mount --rbind "$dir/tmp" /tmp
    mount --bind "$share/hosts" /etc/hosts
    # IPv4 only: IPv6 would add link-local chatter (router solicitations, MLD) to the links
    # whose byte counts the tests read.
    sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip link set lo up
    : >"$dir/ready"
    set +e
    sleep "$lifetime" &
    wait $!
}

# _cluster_shared: the paths besides the test folder that the nodes run programs from: the
# binaries under test and the tests' tools (the build folder) and the sources (the model files,
# launch/, the test scripts); each as named, and where its links lead.
_cluster_shared() {
    local p
    for p in "$MGT_BIN" "$MGT_SRC" "${MGT_BUILD:-}" "${MGT_COMPARE:-}" "${MGT_GRAPH_GRADS:-}"; do
        [ -n "$p" ] || continue
        echo "$p"
        readlink -f "$p"
    done
}

# _cluster_spawn NAME [PARENT]: starts the init of NAME, in a PID namespace below PARENT's (an
# init's pid) or this machine's; sets REPLY to its pid as this machine sees it.
_cluster_spawn() {
    local name=$1 parent=${2:-} dir=$CLUSTER/$1 up pid="" enter=() shared
    mkdir -p "$dir"
    rm -f "$dir/ready"
    [ -n "$parent" ] && enter=(nsenter -t "$parent" -p --)
    mapfile -t shared < <(_cluster_shared)
    "${enter[@]}" unshare --net --uts --mount --propagation private --pid --mount-proc --fork \
        --kill-child=KILL bash -c "$(declare -f _cluster_init); _cluster_init \"\$@\"" \
        _ "$name" "$dir" "$CLUSTER_LIFETIME" "$CLUSTER" "${shared[@]}" >"$dir/init.log" 2>&1 &
    up=$!
    disown "$up" # its end, when a node is killed, is no news to print
    # Milliseconds on an idle machine; a machine busy with other work (other tests beside this
    # one, a build) can take seconds to start the few programs the init runs: 30 s at most.
    for _ in $(seq 600); do
        [ -e "$dir/ready" ] && break
        kill -0 "$up" 2>/dev/null || break
        sleep 0.05
    done
    # The init is the first process down from $up (nsenter, its child, unshare) that is pid 1
    # in its own namespace (the last of its NSpid).
    if [ -e "$dir/ready" ]; then
        local p=$up
        for _ in 1 2 3 4; do
            [ "$(awk '$1 == "NSpid:" { print $NF }' "/proc/$p/status" 2>/dev/null)" = 1 ] && { pid=$p; break; }
            p=$(cat "/proc/$p/task/$p/children" 2>/dev/null)
            p=${p%% *}
            [ -n "$p" ] || break
        done
    fi
    if [ -z "$pid" ]; then
        echo "cluster: $name did not start:"
        cat "$dir/init.log"
        return 1
    fi
    REPLY=$pid
}

node_start() { # node_start NAME: the node's init, its link to the head, its address and route
    local name=$1 i=${NODE_INDEX[$1]} pid
    # The link of a node killed before goes with its namespace, but only once the kernel has
    # freed that, which waits for its sockets: after a silent death that can take minutes.
    nsenter -t "$HEAD_PID" -n ip link del "$name" 2>/dev/null
    _cluster_spawn "$name" "$HEAD_PID" || return 1
    pid=$REPLY
    NODE_PID[$name]=$pid
    # Both ends are created inside their namespaces: nothing appears on this machine's side.
    ip link add "$name" netns "$HEAD_PID" type veth peer name eth0 netns "$pid" ||
        { echo "cluster: cannot create the veth pair of $name"; return 1; }
    nsenter -t "$HEAD_PID" -n ip addr add "10.213.$i.1/24" dev "$name" &&
        nsenter -t "$HEAD_PID" -n ip link set "$name" up &&
        nsenter -t "$pid" -n ip addr add "10.213.$i.2/24" dev eth0 &&
        nsenter -t "$pid" -n ip link set eth0 up &&
        nsenter -t "$pid" -n ip route add default via "10.213.$i.1" ||
        { echo "cluster: cannot configure the network of $name"; return 1; }
    # For cluster-rsh, which runs on the head: the init's pid there (NSpid: this machine's, the
    # head's, the node's).
    awk '$1 == "NSpid:" { print $3 }' "/proc/$pid/status" >"$CLUSTER/$name/pid"
}

cluster_up() { # cluster_up NODE...: the head and these nodes (at most 250)
    [ "$(id -u)" -eq 0 ] || { echo "cluster: namespaces need root"; return 1; }
    "$MGT_SRC/launch/install-deps" iproute2 util-linux procps >/dev/null ||
        { echo "cluster: cannot install iproute2, util-linux and procps"; return 1; }
    CLUSTER=$T/cluster
    export MGT_CLUSTER=$CLUSTER # for cluster-rsh
    mkdir -p "$CLUSTER"
    CLUSTER_NODES=("$@")
    {
        echo "127.0.0.1 localhost"
        echo "10.213.0.1 head"
        local i=1 n
        for n in "$@"; do
            NODE_INDEX[$n]=$i
            echo "10.213.$i.2 $n"
            i=$((i + 1))
        done
    } >"$CLUSTER/hosts"
    _cluster_spawn head || return 1
    HEAD_PID=$REPLY
    # If this shell is killed (a test timeout) its EXIT trap does not run: this watcher then ends
    # the cluster. It checks that the pid is still the head's before it kills it.
    local shell=$$ headnet
    headnet=$(readlink "/proc/$HEAD_PID/ns/net")
    (
        while kill -0 "$shell" 2>/dev/null && [ -d "/proc/$HEAD_PID" ]; do sleep 1; done
        [ "$(readlink "/proc/$HEAD_PID/ns/net" 2>/dev/null)" = "$headnet" ] && kill -KILL "$HEAD_PID"
    ) >/dev/null 2>&1 &
    CLUSTER_WATCHER=$!
    disown "$CLUSTER_WATCHER"
    nsenter -t "$HEAD_PID" -n ip addr add 10.213.0.1/32 dev lo &&
        nsenter -t "$HEAD_PID" -n sysctl -qw net.ipv4.ip_forward=1 ||
        { echo "cluster: cannot configure the head's network"; return 1; }
    for n in "$@"; do node_start "$n" || return 1; done
}

on() { # on NODE|head CMD...: runs CMD (a program, not a shell function) there
    local pid
    if [ "$1" = head ]; then pid=$HEAD_PID; else pid=${NODE_PID[$1]:-}; fi
    [ -n "$pid" ] || { echo "cluster: no node $1" >&2; return 2; }
    shift
    # nsenter forks to enter a PID namespace and waits: a signal to it does not reach CMD, so
    # bound CMD's time inside (on NODE timeout 60 CMD).
    nsenter -t "$pid" -n -u -m -p --wd="$PWD" -- "$@"
}

# _ns_members PID KIND: the pids of every process in the KIND namespace (net, pid) of PID.
_ns_members() {
    local want
    want=$(readlink "/proc/$1/ns/$2" 2>/dev/null) || return 0
    # One ls for all: a readlink per process would take seconds with hundreds of processes.
    ls -l /proc/[0-9]*/ns/"$2" 2>/dev/null | awk -v w="$want" '$NF == w { split($(NF - 2), p, "/"); print p[3] }'
}

node_procs() { # node_procs NODE: "pid name" of every process on NODE but its init's own
    local init=${NODE_PID[$1]} p stat
    for p in $(_ns_members "$init" pid); do
        [ "$p" = "$init" ] && continue
        stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        stat=${stat##*) } # after "pid (name) ": state, parent, ...
        # A zombie has ended (only its parent's wait() is missing); the init's sleep is the
        # init's (an orphan is adopted by the init too, but none is called sleep here).
        [ "${stat%% *}" = Z ] && continue
        [ "$(cut -d' ' -f2 <<<"$stat")" = "$init" ] && [ "$(cat "/proc/$p/comm")" = sleep ] && continue
        echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"
    done
}

node_has() { # node_has NODE NAME: a process called NAME runs on NODE
    node_procs "$1" | awk -v n="$2" '$2 == n { found = 1 } END { exit !found }'
}

node_kill() { # node_kill NODE [silent]: ends every process of NODE at once
    local name=$1 init=${NODE_PID[$1]}
    # silent: the head's end of the link goes down first, so nothing the dying processes send
    # (their sockets' FIN and RST) reaches anyone, as when a node loses power.
    [ "${2:-}" = silent ] && nsenter -t "$HEAD_PID" -n ip link set "$name" down
    # The init of a PID namespace takes every process of the namespace with it.
    kill -KILL "$init" 2>/dev/null
    for _ in $(seq 600); do
        [ -d "/proc/$init" ] || return 0
        sleep 0.05
    done
    echo "cluster: the init of $name is still there 30 s after SIGKILL"
    return 1
}

link_bytes() { # link_bytes NODE: "rx tx" on the head's end of NODE's link
    # /proc/net is the reading process's network namespace.
    nsenter -t "$HEAD_PID" -n awk -v i="$1:" '$1 == i { print $2, $10 }' /proc/net/dev
}

cluster_down() { # the head's init, and with it every process of the head and of every node
    [ -n "$HEAD_PID" ] || return 0
    local members
    members=$(_ns_members "$HEAD_PID" pid)
    kill -KILL "$HEAD_PID" 2>/dev/null
    [ -n "$CLUSTER_WATCHER" ] && kill "$CLUSTER_WATCHER" 2>/dev/null
    local p
    for p in $members; do
        for _ in $(seq 100); do
            [ -d "/proc/$p" ] || break
            sleep 0.05
        done
    done
    HEAD_PID=""
}
