"""Names production code defines and does not call by name, each with who does call it (vulture reads this file as
references; ``_`` stands for any object, vulture matches by name).

Only three kinds belong here: public API a user calls (documented where it says), callbacks a library or the
worker protocol calls by name, and classes named by a string (an ``AppSpec`` target, a registry entry). Anything
else that nothing calls is deleted, not listed.
"""

# ruff: noqa: B018  (bare attribute references are the point of a vulture whitelist)
_ = object()

# -- public API, documented ---------------------------------------------------------------------------------------
_.BunshinSkyRLEnv  # skyrl-gym registers it by name (docs/trainers.md)
_.BunshinAgentLoop  # verl's agent-loop registry names it (docs/trainers.md)
_.set_policy_version  # RolloutEngine API for asynchronous trainers (docs/engine.md)
_.pull  # RolloutEngine pull mode (docs/engine.md)
_.pull_statistics  # RolloutEngine pull mode (docs/engine.md)
_.start_soon  # TaskScope API (envs/runtime/task_scope.py)
_.retried  # RolloutResult.retried (docs/cluster.md)
_.read_parts  # WorkspaceImage's files whole, for WorkspaceRuntime.restore_image (docs/fork.md)
_.write_node  # CheckpointStore: plan and commit one node's checkpoint in one call (docs/fork.md)
_.wait_idle  # CheckpointWriters: until every queued checkpoint write has ended (docs/prefix.md)
_.to_call  # ToolSchema: a Struct built in Python as its normal-form call (docs/suites.md)

# -- named by a string: registry entries and AppSpec targets ---------------------------------------------------
_.WebShopSuite  # envs/suites/registry.py
_.DesktopSuite  # envs/suites/registry.py
_.OSWorldSuite  # envs/suites/registry.py
_.WebArenaSuite  # envs/suites/registry.py
_.ShopApp  # envs/webshop/suite.py SHOP_APP
_.HeapApp  # engine/commands/demo.py and the fork benchmark's AppSpec target
_.XDesktopApp  # envs/xdesktop/app.py: the AppSpec target of a workspace with a real X desktop (docs/osworld.md)
_.SitesApp  # envs/webarena/suite.py SITES_APP: the AppSpec target of a WebArena task's workspace (docs/webarena.md)
_.ChromiumSlotApp  # envs/chromium/slot.py TARGET: the warm pool starts it by name (envs/runtime/warm_pool.py)
_.rpc_port  # WorkerApp methods are called as rpc_<name> by envs/runtime/workers.py ("port" in envs/webshop/app.py)

# -- callbacks the standard library calls by name ------------------------------------------------------------------
_.handle_starttag  # html.parser.HTMLParser (envs/webshop/browser/dom.py)
_.handle_startendtag
_.handle_endtag
_.handle_comment
_.handle_decl
_.handle_pi
_.unknown_decl
_.http_open  # urllib.request.BaseHandler (envs/webshop/browser/loader.py)
_.do_GET  # http.server.BaseHTTPRequestHandler (envs/webshop/server.py)
_.do_POST
_.log_message

# -- OSWorld's Provider and VMManager contracts (desktop_env.providers.base), called by its DesktopEnv -----------
_.get_ip_address  # engine/adapters/osworld_env.py RuntimeProvider
_.save_state
_.revert_to_snapshot
_.checked_and_cleaned  # envs/xdesktop/osworld_judge.py NoVMManager
_.initialize_registry
_.add_vm
_.delete_vm
_.occupy_vm
_.check_and_clean
_.list_free_vms
_.get_vm_path
_.desktop_env  # engine/adapters/osworld_env.py: the DesktopEnv OSWorld users build on the runtime (docs/osworld.md)

# -- BrowserGym's task contract (browsergym.core.task.AbstractBrowserTask), called by its BrowserEnv --------------
_.get_task_id  # engine/adapters/browsergym.py ShopTask
_.validate
_.debian_chromium  # engine/adapters/browsergym.py: what a user calls to run BrowserGym on Debian's Chromium (docs/browsergym.md)
