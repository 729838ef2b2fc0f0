-- Pass-through job_submit plugin of the dev cluster: off by default; HADAR_DEVCLUSTER_LUA=1
-- enables it (JobSubmitPlugins=lua).  It only logs, to show the plugin is loaded and called.
function slurm_job_submit(job_desc, part_list, submit_uid)
   slurm.log_info("hadar job_submit.lua: uid=%u name=%s comment=%s",
                  submit_uid, tostring(job_desc.name), tostring(job_desc.comment))
   return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
slurm.log_info("hadar job_submit.lua loaded")
return slurm.SUCCESS
