# Consul policy of the gpujob task driver's token: the plugin config's
# consul { token } (or CONSUL_HTTP_TOKEN in the Nomad client's environment).
# The driver hands the token to each task's supervisor, which runs the
# rendezvous and, for a sweep's trial, reports its metrics and reads its
# stop request.
#
#   consul acl policy create -name gpujob-driver -rules @jobspecs/acl/consul-gpujob-driver.hcl
#   consul acl token create -policy-name gpujob-driver -description "gpujob task driver"
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1 (make dev ACL=1).

# The rendezvous keeps every record under the plugin's key_prefix
# ("gpujob/rendezvous" by default; change both together): it reads, writes,
# locks (acquire/release with its session), checks-and-sets, deletes and
# lists keys there, and deletes a finished run's tree. The trailing slash
# keeps a sibling such as gpujob/rendezvous-other out of reach.
key_prefix "gpujob/rendezvous/" {
  policy = "write"
}

# A sweep's trial (task config sweep and trial): the supervisor that hosts
# rank 0 writes the trial's metrics record,
# <sweep_key_prefix>/<ns>/<sweep>/trials/<trial>/metrics, with an acquire
# under a session of its own (so the record shows exactly while a live
# supervisor reports), and every member of the trial reads its stop request,
# .../trials/<trial>/stop, with blocking queries. It writes nothing else
# (no stop request, no sweep spec or state), but Consul's rules match key
# prefixes, and no prefix holds every trial's metrics record without its
# stop request, so the driver gets write on the sweeps' tree
# ("gpujob/sweeps" by default: the plugin's sweep_key_prefix; change both
# together). The <ns> in those keys is always the job's own Nomad
# namespace, which the driver takes from Nomad, never from the job.
# So this token can write any sweep's record, trial template included: a
# sweep's controller therefore registers nothing from a record that is not
# byte for byte what gpujob sweep submit wrote (with ACLs, submit keeps the
# record's SHA-256 in the controller's Nomad variable, which only ACL
# administrators can write), and nothing a state names but its own trial
# jobs with values of its own search space. Keep this token on the clients.
key_prefix "gpujob/sweeps/" {
  policy = "write"
}

# Each supervisor creates, renews and destroys a session (the TTL that makes
# a dead member's registration vanish) and reads it back. Sessions belong to
# the node of the Consul agent the supervisor talks to, which differs from
# one Nomad client to the next while the token is the same for all, hence a
# prefix of "". Where every client has its own token, narrow it to that
# node: session "<node name>" { policy = "write" }.
# Nothing else: no node, service, agent, operator or ACL rule. A session's
# node checks (serfHealth) are verified by the servers without the token.
session_prefix "" {
  policy = "write"
}
